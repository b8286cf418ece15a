//! Resolving a file owner's uid to the identity a job runs with.

use std::ffi::{CStr, CString};
use std::path::PathBuf;

/// The identity a job runs as, resolved from the spool file's `st_uid`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    pub name: String,
    pub home: PathBuf,
    /// Supplementary groups from the group database, without the primary.
    #[serde(default)]
    pub groups: Vec<u32>,
}

/// Looks up `uid` in the passwd database; `None` when it has no entry
/// (such a uid is never given a job: systemd could not set up its
/// environment, and nobody could be told about it).
pub fn owner_of_uid(uid: u32) -> Option<Owner> {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: passwd is plain data; getpwuid_r writes into pwd and buf only.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    // SAFETY: on success the strings point into buf, which is alive here.
    let name = unsafe { CStr::from_ptr(pwd.pw_name) }
        .to_string_lossy()
        .into_owned();
    let home = PathBuf::from(
        unsafe { CStr::from_ptr(pwd.pw_dir) }
            .to_string_lossy()
            .into_owned(),
    );
    let gid = pwd.pw_gid;
    let groups = supplementary_groups(&name, gid);
    Some(Owner {
        uid,
        gid,
        name,
        home,
        groups,
    })
}

/// Looks up a user name, for the `user` field check and for tests.
pub fn uid_of_name(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: as in owner_of_uid.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    let rc = unsafe {
        libc::getpwnam_r(
            c.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    (rc == 0 && !result.is_null()).then_some(pwd.pw_uid)
}

fn supplementary_groups(name: &str, gid: u32) -> Vec<u32> {
    let Ok(c) = CString::new(name) else {
        return Vec::new();
    };
    let mut count: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; count as usize];
        let before = count;
        // SAFETY: groups has room for `count` entries; getgrouplist updates count.
        let rc = unsafe { libc::getgrouplist(c.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(count as usize);
            groups.retain(|g| *g != gid);
            groups.sort_unstable();
            groups.dedup();
            return groups;
        }
        if count <= before {
            // The database did not say how many it needs; give up on extras.
            return Vec::new();
        }
    }
}

/// How long a looked-up owner is trusted: a user added to a group, or
/// given another home, is seen by jobs claimed after this (like nscd).
pub const OWNER_CACHE_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// Owners looked up recently, by uid. A lookup goes through NSS, which on
/// systemd hosts asks PID 1 over varlink (`nss-systemd`) and may ask LDAP:
/// on a busy host that round trip is most of the time from a drop to the
/// claim, and a user usually drops many files in a row. Unknown uids are
/// never cached: a user created a moment ago is seen at once.
#[derive(Default)]
pub struct OwnerCache {
    entries: std::collections::HashMap<u32, (std::time::Instant, Owner)>,
}

impl OwnerCache {
    pub fn owner_of_uid(&mut self, uid: u32) -> Option<Owner> {
        self.lookup(uid, std::time::Instant::now(), owner_of_uid)
    }

    fn lookup(
        &mut self,
        uid: u32,
        now: std::time::Instant,
        resolve: impl FnOnce(u32) -> Option<Owner>,
    ) -> Option<Owner> {
        if let Some((at, owner)) = self.entries.get(&uid) {
            if now.saturating_duration_since(*at) < OWNER_CACHE_TTL {
                return Some(owner.clone());
            }
        }
        // Bounded by the host's users; stale entries go when looked up.
        self.entries
            .retain(|_, (at, _)| now.saturating_duration_since(*at) < OWNER_CACHE_TTL);
        let owner = resolve(uid)?;
        self.entries.insert(uid, (now, owner.clone()));
        Some(owner)
    }
}

/// `getgrnam_r`, the one lookup the policy needs.
pub fn gid_of_group(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // SAFETY: group is plain data; getgrnam_r writes into grp and buf only.
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        let rc = unsafe {
            libc::getgrnam_r(
                c.as_ptr(),
                &mut grp,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && buf.len() < (1 << 22) {
            // Large groups list many members; give the lookup more room.
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        return (rc == 0 && !result.is_null()).then_some(grp.gr_gid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_cached_for_a_while_and_unknown_uids_never() {
        let mut cache = OwnerCache::default();
        let t0 = std::time::Instant::now();
        let calls = std::cell::Cell::new(0);
        let resolve = |uid: u32| {
            calls.set(calls.get() + 1);
            (uid == 1000).then(|| Owner {
                uid,
                gid: uid,
                name: format!("u{}", calls.get()),
                home: "/home/u".into(),
                groups: Vec::new(),
            })
        };
        assert_eq!(cache.lookup(1000, t0, resolve).unwrap().name, "u1");
        let soon = t0 + OWNER_CACHE_TTL / 2;
        assert_eq!(cache.lookup(1000, soon, resolve).unwrap().name, "u1");
        assert_eq!(calls.get(), 1);
        let later = t0 + OWNER_CACHE_TTL;
        assert_eq!(cache.lookup(1000, later, resolve).unwrap().name, "u2");
        assert!(cache.lookup(7, later, resolve).is_none());
        assert!(cache.lookup(7, later, resolve).is_none());
        assert_eq!(calls.get(), 4);
    }

    #[test]
    fn root_resolves_and_unknown_uid_does_not() {
        let root = owner_of_uid(0).unwrap();
        assert_eq!(root.name, "root");
        assert_eq!(uid_of_name("root"), Some(0));
        assert!(owner_of_uid(3_999_999_999).is_none());
    }

    #[test]
    fn system_group_lookup() {
        assert_eq!(gid_of_group("root"), Some(0));
        assert_eq!(gid_of_group("no-such-group-ptrain-test"), None);
        assert_eq!(gid_of_group("bad\0name"), None);
    }
}
