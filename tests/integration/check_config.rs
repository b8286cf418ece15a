//! `ptraind --check-config` and ptraind's start judge a config by the same
//! checks: what the check calls an error the start refuses, naming the key
//! and the fix; warnings are printed and leave the exit status 0.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use crate::daemon::{text, PTRAIND};

/// `ptraind --config CONFIG ARGS`, bounded: a start that wrongly went on
/// would wait on D-Bus, and must fail the test rather than hang it.
fn ptraind(config: &Path, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("60")
        .arg(PTRAIND)
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("JOURNAL_STREAM")
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

fn write_config(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("ptrain.toml");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

#[test]
fn check_config_and_start_refuse_what_they_used_to_call_ok() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = write_config(
        d,
        &format!(
            "spool_dir = {spool:?}\nstate_dir = {state:?}\nlog_dir = {log:?}\nruntime_dir = {run:?}\n\
             slice = \"system.slice\"\n\
             [gpus]\nbackend = \"declared\"\n\
             [[gpus.declared]]\nindex = 0\nuuid = \"GPU-0\"\nname = \"Test GPU\"\nmemory_mib = 1024\ndevice = \"/dev/ptrain-test-nvidia0\"\n\
             [policy.users.no-such-user-here]\nallowed_gpus = [0, 7]\n\
             [channels.hook]\nkind = \"webhook\"\nurl = \"https://hooks.example.com/\"\nsecret_file = {secret:?}\n",
            spool = d.join("spool"),
            state = d.join("state"),
            log = d.join("log"),
            run = d.join("run"),
            secret = d.join("hook.secret"),
        ),
    );
    let out = ptraind(&config, &["--check-config"]);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(2), "{shown}");
    let prefix = format!("error: config {}: key", config.display());
    for expected in [
        format!("{prefix} `channels.hook.secret_file`: cannot read"),
        format!("{prefix} `slice`: \"system.slice\" is shared"),
        format!("{prefix} `policy.users.no-such-user-here.allowed_gpus[1]`: GPU 7 is not in [[gpus.declared]]"),
        "warning: config".to_owned(),
        "key `policy.users.no-such-user-here`: there is no user".to_owned(),
        "key `gpus.declared[0].device`: GPU 0 is kept out of the pool".to_owned(),
        "3 error(s), 2 warning(s); ptraind would refuse to start".to_owned(),
    ] {
        assert!(shown.contains(&expected), "missing {expected:?} in:\n{shown}");
    }
    assert!(!shown.contains(": ok"), "{shown}");

    // The start applies the same errors, before touching any directory.
    let out = ptraind(&config, &[]);
    let logged = text(&out);
    assert_eq!(out.status.code(), Some(2), "{logged}");
    assert!(
        logged.contains("key `slice`") && logged.contains("refusing to start: 3 error(s)"),
        "{logged}"
    );
    assert!(!d.join("state").exists(), "{logged}");
}

#[test]
fn check_config_prints_warnings_and_passes_and_names_type_errors() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "[gpus]\nbackend = \"declared\"\n[policy.users.no-such-user-here]\nmax_gpus = 1\n",
    );
    let out = ptraind(&config, &["--check-config"]);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(
        shown.contains("warning: config")
            && shown.contains("`policy.users.no-such-user-here`")
            && shown.contains("0 error(s), 1 warning(s); ptraind would start"),
        "{shown}"
    );

    let config = write_config(dir.path(), "max_queued_per_user = \"many\"\n");
    let out = ptraind(&config, &["--check-config"]);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(2), "{shown}");
    assert!(
        shown.contains("key `max_queued_per_user`")
            && shown.contains("expected a whole number")
            && shown.contains("(line 1)"),
        "{shown}"
    );
}
