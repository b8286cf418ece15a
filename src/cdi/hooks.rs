//! What the vendor's hooks would have done, as data. Pure.
//!
//! ptraind never runs a CDI hook: a hook runs as root, in the host's
//! namespaces, over the container's root tree, which here is a shared
//! image tree that anyone who could submit an image chose (its symlinks,
//! its `/etc/ld.so.conf`), and it writes into that tree, which ptrain
//! keeps read-only and shared between jobs. Instead the two hooks
//! nvidia-ctk writes are read for their effect:
//!
//! - `create-symlinks --link TARGET::LINK`: a symlink at LINK (in the
//!   container) pointing at TARGET (resolved in the container). Given back
//!   as [`Symlink`]s, which ptraind realises in a per-job layer over the
//!   image (see [`super`]'s "Realising it"). Links under `/dev` are
//!   dropped: the job's `/dev` is the host's (`MountAPIVFS=yes`), where
//!   udev made them already (`/dev/dri/by-path/...`), and creating them
//!   would write into the host's `/dev`.
//! - `update-ldcache --folder DIR`: runs `ldconfig` in the container so
//!   the driver's libraries (bound into DIR) are found, which also makes
//!   their soname links (`libcuda.so.1 -> libcuda.so.550.54.15`). Given
//!   back as the folders ([`ld_library_path`] puts them on the job's
//!   `LD_LIBRARY_PATH`) and, once the libraries' sonames are read
//!   ([`soname_links`]), the soname links.
//!
//! Two more are known to need nothing here: `chmod` of paths under `/dev`
//! (the host's `/dev`, with the host's modes: the hook would change the
//! host) and `disable-device-node-modification` (it stops the driver
//! library from making device nodes, which a job cannot do anyway:
//! `DevicePolicy=closed`, no `CAP_MKNOD`, and `/dev` is the host's). Any
//! other hook is refused with the spec file and the hook named: skipping
//! it would run the job without what the vendor said the device needs.

use std::path::{Component, Path, PathBuf};

use super::registry::Sourced;
use super::spec::Hook;
use super::CdiError;

/// A symlink the job's root must show: `link` (absolute, in the container)
/// points at `target` (as written: relative to the link's directory, or
/// absolute within the container).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Symlink {
    pub link: PathBuf,
    pub target: PathBuf,
}

/// The effects of a set of hooks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HookEffects {
    pub symlinks: Vec<Symlink>,
    /// The folders `update-ldcache` would add to the loader's cache, in
    /// order, each once.
    pub library_dirs: Vec<PathBuf>,
}

/// The programs whose hooks ptrain knows: `nvidia-ctk hook SUBCOMMAND` and
/// (toolkit 1.17 on) `nvidia-cdi-hook SUBCOMMAND`.
const NVIDIA_CTK: &str = "nvidia-ctk";
const NVIDIA_CDI_HOOK: &str = "nvidia-cdi-hook";

/// Reads each hook for its effect; refuses one it does not know.
pub fn interpret(hooks: &[Sourced<Hook>]) -> Result<HookEffects, CdiError> {
    let mut effects = HookEffects::default();
    for hook in hooks {
        interpret_one(&hook.spec, &hook.item, &mut effects)?;
    }
    Ok(effects)
}

fn interpret_one(spec: &Path, hook: &Hook, effects: &mut HookEffects) -> Result<(), CdiError> {
    let refuse = |why: String| CdiError::Hook {
        spec: spec.to_path_buf(),
        hook: shown(hook),
        why,
    };
    if hook.hook_name != "createContainer" {
        return Err(refuse(format!(
            "it runs at {}, and ptrain knows only nvidia's createContainer hooks",
            hook.hook_name
        )));
    }
    let program = Path::new(&hook.path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    // args[0] is argv[0], as in execv.
    let args: &[String] = hook.args.get(1..).unwrap_or_default();
    let rest = match (program, args.first().map(String::as_str)) {
        (NVIDIA_CTK, Some("hook")) => &args[1..],
        (NVIDIA_CDI_HOOK, _) => args,
        _ => return Err(refuse("it is not an nvidia-ctk hook".into())),
    };
    let Some((subcommand, flags)) = rest.split_first() else {
        return Err(refuse("it names no hook subcommand".into()));
    };
    let flags = parse_flags(flags).map_err(&refuse)?;
    match subcommand.as_str() {
        "create-symlinks" => {
            for (flag, value) in flags {
                if flag != "link" {
                    return Err(refuse(format!("create-symlinks has the unknown flag --{flag}")));
                }
                let Some((target, link)) = value.split_once("::") else {
                    return Err(refuse(format!("--link {value:?} is not TARGET::LINK")));
                };
                let link = container_path(link).map_err(|why| refuse(format!("the link {link:?} {why}")))?;
                if target.is_empty() || target.contains('\0') {
                    return Err(refuse(format!("the link {} has no target", link.display())));
                }
                if link.starts_with("/proc") || link.starts_with("/sys") {
                    return Err(refuse(format!(
                        "the link {} is in the host's /proc or /sys",
                        link.display()
                    )));
                }
                if link.starts_with("/dev") {
                    // The host's /dev, where udev made it (module doc).
                    continue;
                }
                let symlink = Symlink {
                    link,
                    target: PathBuf::from(target),
                };
                if !effects.symlinks.contains(&symlink) {
                    effects.symlinks.push(symlink);
                }
            }
        }
        "update-ldcache" => {
            for (flag, value) in flags {
                match flag.as_str() {
                    "folder" => {
                        let dir = container_path(&value)
                            .map_err(|why| refuse(format!("the folder {value:?} {why}")))?;
                        if !effects.library_dirs.contains(&dir) {
                            effects.library_dirs.push(dir);
                        }
                    }
                    // Which host ldconfig the hook would run: no effect of
                    // its own.
                    "ldconfig-path" => {}
                    _ => return Err(refuse(format!("update-ldcache has the unknown flag --{flag}"))),
                }
            }
        }
        "chmod" => {
            for (flag, value) in flags {
                match flag.as_str() {
                    "mode" => {}
                    "path" if Path::new(&value).starts_with("/dev") => {}
                    "path" => {
                        return Err(refuse(format!(
                            "it changes the mode of {value}, outside /dev, which ptrain cannot do without writing into the image"
                        )))
                    }
                    _ => return Err(refuse(format!("chmod has the unknown flag --{flag}"))),
                }
            }
        }
        "disable-device-node-modification" if flags.is_empty() => {}
        other => {
            return Err(refuse(format!(
                "ptrain applies only the create-symlinks, update-ldcache, chmod (of /dev) and disable-device-node-modification hooks, not {other}"
            )))
        }
    }
    Ok(())
}

/// `--name value` and `--name=value` pairs; anything else is refused
/// (a positional argument or a boolean flag ptrain would misread).
fn parse_flags(args: &[String]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let Some(flag) = arg.strip_prefix("--") else {
            return Err(format!("it has the argument {arg:?}, which is no --flag"));
        };
        match flag.split_once('=') {
            Some((name, value)) => out.push((name.to_owned(), value.to_owned())),
            None => match it.next() {
                Some(value) => out.push((flag.to_owned(), value.clone())),
                None => return Err(format!("--{flag} has no value")),
            },
        }
    }
    Ok(out)
}

/// A path in the container: absolute, without `.`/`..` or empty
/// components (so it means what it says, whatever the image holds).
pub(super) fn container_path(text: &str) -> Result<PathBuf, &'static str> {
    if !text.starts_with('/') || text.contains('\0') {
        return Err("is not an absolute path");
    }
    if text.contains("//") || (text.len() > 1 && text.ends_with('/')) {
        return Err("has an empty component");
    }
    let path = PathBuf::from(text);
    if path
        .components()
        .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
    {
        return Err("has a . or .. component");
    }
    Ok(path)
}

fn shown(hook: &Hook) -> String {
    let mut parts = vec![hook.path.clone()];
    parts.extend(hook.args.iter().skip(1).cloned());
    parts.join(" ")
}

/// The job's `LD_LIBRARY_PATH` with the driver's library folders: after
/// what the job or image set (the loader's cache, which the hook would
/// have filled, comes after `LD_LIBRARY_PATH` too), each folder once, no
/// empty entry (an empty entry means the working directory). `None` when
/// there is nothing to set.
pub fn ld_library_path(existing: Option<&str>, dirs: &[PathBuf]) -> Option<String> {
    let mut entries: Vec<String> = existing
        .unwrap_or_default()
        .split(':')
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
        .collect();
    for dir in dirs {
        let dir = dir.display().to_string();
        if !entries.contains(&dir) {
            entries.push(dir);
        }
    }
    (!entries.is_empty()).then(|| entries.join(":"))
}

/// The soname links `ldconfig` would make in the library folders: for a
/// library bound at `DIR/libcuda.so.550.54.15` whose soname is
/// `libcuda.so.1`, the link `DIR/libcuda.so.1 -> libcuda.so.550.54.15`.
/// `files` are the (container path, host path) of the bound files;
/// `soname_of` reads a host file's `DT_SONAME` (I/O:
/// [`super::load::read_soname`]). A link already present in `existing`
/// (a create-symlinks link) or a bound file at that path wins.
pub fn soname_links(
    files: &[(PathBuf, PathBuf)],
    dirs: &[PathBuf],
    existing: &[Symlink],
    mut soname_of: impl FnMut(&Path) -> Option<String>,
) -> Vec<Symlink> {
    let mut links: Vec<Symlink> = Vec::new();
    for (container, host) in files {
        let (Some(dir), Some(name)) = (container.parent(), container.file_name()) else {
            continue;
        };
        let name = name.to_string_lossy();
        if !dirs.iter().any(|d| d == dir) || !name.starts_with("lib") || !name.contains(".so") {
            continue;
        }
        let Some(soname) = soname_of(host) else {
            continue;
        };
        if soname == name || soname.is_empty() || soname.contains('/') || soname.starts_with('.') {
            continue;
        }
        let link = dir.join(&soname);
        let taken = existing.iter().chain(&links).any(|l| l.link == link)
            || files.iter().any(|(c, _)| *c == link);
        if !taken {
            links.push(Symlink {
                link,
                target: PathBuf::from(name.as_ref()),
            });
        }
    }
    links
}
