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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_resolves_and_unknown_uid_does_not() {
        let root = owner_of_uid(0).unwrap();
        assert_eq!(root.name, "root");
        assert_eq!(uid_of_name("root"), Some(0));
        assert!(owner_of_uid(3_999_999_999).is_none());
    }
}
