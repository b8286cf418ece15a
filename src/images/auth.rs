//! Registry credentials for pulls: the admin's, for every job, and a
//! user's own, for that user's jobs only.
//!
//! Both files have the format `docker login`, `podman login` and `skopeo
//! login --authfile FILE` write: `{"auths": {"REGISTRY": {"auth":
//! "BASE64(user:password)"}}}` (or `"username"` and `"password"`
//! fields). Docker Hub is `docker.io` (also read under docker's
//! `https://index.docker.io/v1/`). Credential helpers (`credsStore`) are
//! not run: ptraind runs no program a user names.
//!
//! - The admin's ([`AdminAuth`], `[images] auth_file`,
//!   `/etc/ptrain/registry-auth.json` by default) is read by root at each
//!   pull and must be root's and readable by root alone (0600): it lends
//!   its access to every user's jobs, so no one else may read or change
//!   it. Otherwise the pull fails naming the file and the fix.
//! - A user's own (`~/.config/containers/auth.json`, then
//!   `~/.docker/config.json`) is read with the user's identity (fsuid) at
//!   the pull of one of their jobs, and used for that pull alone: their
//!   pull is not shared with another user's job, so their access never
//!   serves anyone else's. It wins over the admin's for its registries.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::registry::Credentials;

/// Largest credentials file read.
const MAX_AUTH_BYTES: u64 = 1 << 20;

/// The admin's file, unless `[images] auth_file` says otherwise.
pub const DEFAULT_ADMIN_FILE: &str = "/etc/ptrain/registry-auth.json";

/// Where a user's own credentials are looked for, under their home, in
/// order (podman's and skopeo's, then docker's).
pub const USER_FILES: &[&str] = &[".config/containers/auth.json", ".docker/config.json"];

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("registry credentials {path}: {problem}")]
    Unsafe { path: PathBuf, problem: String },
    #[error("registry credentials {path}: {problem}; write it as `skopeo login --authfile {path} REGISTRY` does")]
    Format { path: PathBuf, problem: String },
    #[error("registry credentials {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Deserialize)]
struct RawFile {
    #[serde(default)]
    auths: BTreeMap<String, RawEntry>,
}

#[derive(Deserialize)]
struct RawEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// Credentials by registry, as a file holds them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthFile {
    by_registry: BTreeMap<String, Credentials>,
}

impl AuthFile {
    /// Parses an auth file's bytes (`path` names it in errors). Pure.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<AuthFile, AuthError> {
        let format = |problem: String| AuthError::Format {
            path: path.to_owned(),
            problem,
        };
        let raw: RawFile =
            serde_json::from_slice(bytes).map_err(|e| format(format!("not JSON: {e}")))?;
        let mut by_registry = BTreeMap::new();
        for (key, entry) in raw.auths {
            let credentials = match (entry.auth, entry.username, entry.password) {
                (Some(auth), _, _) => {
                    let decoded = base64_decode(auth.trim())
                        .and_then(|b| String::from_utf8(b).ok())
                        .ok_or_else(|| format(format!("the `auth` of {key} is not base64")))?;
                    let (username, password) = decoded.split_once(':').ok_or_else(|| {
                        format(format!("the `auth` of {key} is not `user:password`"))
                    })?;
                    Credentials {
                        username: username.to_owned(),
                        password: password.to_owned(),
                    }
                }
                (None, Some(username), Some(password)) => Credentials { username, password },
                // A helper's entry (`{}`): nothing inline to use.
                _ => continue,
            };
            by_registry.insert(registry_of(&key), credentials);
        }
        Ok(AuthFile { by_registry })
    }

    /// The credentials for `registry` (`host[:port]` as references name
    /// it), if the file has some.
    pub fn get(&self, registry: &str) -> Option<&Credentials> {
        self.by_registry.get(registry)
    }
}

/// A key of `auths` as the registry references name: a URL's host (and
/// port), docker's Hub aliases as `docker.io`.
fn registry_of(key: &str) -> String {
    let host = key
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".into()
        }
        _ => host,
    }
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// Reads `path` whole within the bound, opened without blocking (a FIFO
/// is refused, not waited on) and checked to be a regular file; with
/// `root_only`, owned by root and not readable or writable by anyone
/// else. `None` when there is no such file.
fn read_file(path: &Path, root_only: bool) -> Result<Option<Vec<u8>>, AuthError> {
    let io = |source| AuthError::Io {
        path: path.to_owned(),
        source,
    };
    // The admin's file is named by root: a symlink there is refused (its
    // target's owner and mode would be checked, not the name's).
    let follow = if root_only { libc::O_NOFOLLOW } else { 0 };
    let mut options = std::fs::OpenOptions::new();
    options
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC | follow);
    let file = match options.open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let meta = file.metadata().map_err(io)?;
    let unsafe_file = |problem: &str| AuthError::Unsafe {
        path: path.to_owned(),
        problem: problem.to_owned(),
    };
    if !meta.is_file() {
        return Err(unsafe_file("not a regular file"));
    }
    if root_only && (meta.uid() != 0 || meta.mode() & 0o077 != 0) {
        return Err(unsafe_file(
            "it lends its registry access to every user's jobs, so it must be root's and readable by root alone; chown root: it and chmod 600 it",
        ));
    }
    if meta.len() > MAX_AUTH_BYTES {
        return Err(unsafe_file("larger than 1 MiB"));
    }
    let mut bytes = Vec::new();
    file.take(MAX_AUTH_BYTES)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    Ok(Some(bytes))
}

/// The admin's credentials file, read by root at each pull.
#[derive(Clone, Debug)]
pub struct AdminAuth {
    pub path: PathBuf,
}

impl AdminAuth {
    /// The file's credentials (empty when there is no file).
    pub fn read(&self) -> Result<AuthFile, AuthError> {
        match read_file(&self.path, true)? {
            Some(bytes) => AuthFile::parse(&self.path, &bytes),
            None => Ok(AuthFile::default()),
        }
    }
}

/// A user's own credentials for `registry`: the first of [`USER_FILES`]
/// under `home` that names it, read with the user's identity. A file
/// that cannot be read or parsed is an error naming it (the user's own
/// to fix).
pub fn read_user(
    home: &Path,
    uid: u32,
    gid: u32,
    groups: &[u32],
    registry: &str,
) -> Result<Option<Credentials>, AuthError> {
    for name in USER_FILES {
        let path = home.join(name);
        let read = crate::fsutil::as_user(uid, gid, groups, || read_file(&path, false)).map_err(
            |source| AuthError::Io {
                path: path.clone(),
                source,
            },
        )??;
        let Some(bytes) = read else {
            continue;
        };
        if let Some(credentials) = AuthFile::parse(&path, &bytes)?.get(registry) {
            return Ok(Some(credentials.clone()));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn docker_and_podman_files_parse_with_hub_aliases_and_helpers_skipped() {
        let text = br#"{"auths": {
            "registry.example.com": {"auth": "YWxpY2U6czNjcjN0"},
            "https://index.docker.io/v1/": {"auth": "Ym9iOnA6dw=="},
            "127.0.0.1:5000": {"username": "u", "password": "p"},
            "helper.example.com": {}
        }, "credsStore": "desktop"}"#;
        let file = AuthFile::parse(Path::new("/x"), text).unwrap();
        let get = |r| {
            file.get(r)
                .map(|c| (c.username.as_str(), c.password.as_str()))
        };
        assert_eq!(get("registry.example.com"), Some(("alice", "s3cr3t")));
        // The password keeps its own colons.
        assert_eq!(get("docker.io"), Some(("bob", "p:w")));
        assert_eq!(get("127.0.0.1:5000"), Some(("u", "p")));
        assert_eq!(get("helper.example.com"), None);
        for bad in [
            &b"not json"[..],
            br#"{"auths": {"r": {"auth": "!!"}}}"#,
            br#"{"auths": {"r": {"auth": "bm9jb2xvbg=="}}}"#,
        ] {
            let err = AuthFile::parse(Path::new("/etc/a.json"), bad).unwrap_err();
            assert!(err.to_string().contains("/etc/a.json"), "{err}");
        }
    }

    #[test]
    fn the_admins_file_must_be_roots_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.json");
        let admin = AdminAuth { path: path.clone() };
        // No file: no credentials.
        assert_eq!(admin.read().unwrap(), AuthFile::default());
        std::fs::write(&path, br#"{"auths": {"r:1": {"auth": "dTpw"}}}"#).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = admin.read().unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(admin.read().unwrap().get("r:1").unwrap().username, "u");
        // A symlink to it is refused (a user could point one at any file).
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(AdminAuth { path: link }.read().is_err());
        // A FIFO is refused at once, not waited on.
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(AdminAuth { path: fifo }.read().is_err());
    }

    #[test]
    fn a_users_own_file_is_read_as_them_podmans_first() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path();
        std::fs::create_dir_all(home.join(".config/containers")).unwrap();
        std::fs::create_dir_all(home.join(".docker")).unwrap();
        std::fs::write(
            home.join(".config/containers/auth.json"),
            br#"{"auths": {"a:1": {"auth": "cG9kOm1hbg=="}}}"#,
        )
        .unwrap();
        std::fs::write(
            home.join(".docker/config.json"),
            br#"{"auths": {"a:1": {"auth": "ZG9jOmtlcg=="}, "b:2": {"auth": "ZDpr"}}}"#,
        )
        .unwrap();
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let read = |r| {
            read_user(home, uid, gid, &[gid], r)
                .unwrap()
                .map(|c| c.username)
        };
        assert_eq!(read("a:1").as_deref(), Some("pod"));
        assert_eq!(read("b:2").as_deref(), Some("d"));
        assert_eq!(read("c:3"), None);
    }
}
