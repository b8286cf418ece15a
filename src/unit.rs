//! The transient unit a job runs as, built from its record. Pure: the
//! properties are plain values here and become D-Bus variants in
//! [`crate::systemd`].
//!
//! Every job unit carries a confinement baseline that nothing in the job
//! file can loosen: the descriptor has no field that reaches these
//! properties, and user environment entries cannot name the daemon's
//! variables (the spec rejects them).
//!
//! Nothing the job's owner wrote is a unit property but the working
//! directory and the numbers ptraind checked: the command and the
//! environment travel in the launch file ([`crate::runtime`]), so
//! other users cannot read them with `systemctl show`, and every property
//! survives `daemon-reload` (systemd 252 rewrites a transient unit from its
//! file then, and cannot read back `ExecStartEx=`, nor `$` and `%` in
//! arguments, as written).

use std::path::{Path, PathBuf};

use crate::gpu::NVIDIA_CONTROL_NODES;
use crate::runtime::{LaunchFile, PreparedLaunch};
use crate::store::JobRecord;

/// What a unit looks like now.
#[derive(Debug, Clone, Default)]
pub struct UnitState {
    pub active_state: String,
    /// A job (start or stop) is still pending for the unit.
    pub has_pending_job: bool,
    pub invocation_id: Option<String>,
    pub main_pid: u32,
    pub result: String,
    /// CLD_EXITED (1), CLD_KILLED (2), CLD_DUMPED (3), or 0 if never ran.
    pub exec_main_code: i32,
    pub exec_main_status: i32,
    /// Microseconds since the epoch, 0 when unknown.
    pub exec_main_start: u64,
    pub exec_main_exit: u64,
    pub inactive_enter: u64,
    /// `running`, `freezing`, `frozen` or `thawing` (cgroup v2's freezer).
    pub freezer_state: String,
}

impl UnitState {
    /// The unit is done: inactive or failed, with no job pending.
    pub fn has_ended(&self) -> bool {
        !self.has_pending_job && matches!(self.active_state.as_str(), "inactive" | "failed")
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum PropValue {
    Str(String),
    Bool(bool),
    U64(u64),
    U32(u32),
    /// An array of byte strings (`aay`), e.g. LogExtraFields.
    ByteStrings(Vec<Vec<u8>>),
    StrList(Vec<String>),
    /// ExecStart (`a(sasb)`): (path, argv, ignore failure).
    Exec(Vec<(String, Vec<String>, bool)>),
    /// `a(ss)`: DeviceAllow (node, "rw"), TemporaryFileSystem (path,
    /// options).
    Pairs(Vec<(String, String)>),
    /// `a(ssbt)`: BindPaths, BindReadOnlyPaths (source, destination,
    /// ignore a missing source, mount flags).
    Binds(Vec<(String, String, bool, u64)>),
}

pub type UnitProperties = Vec<(&'static str, PropValue)>;

/// Lines a job may log per journald rate-limit interval (30 s): more than
/// journald writes in that time on any host (a few 100,000 a second).
/// journald scales it by up to 12 for free space in 32-bit arithmetic,
/// so it stays under u32::MAX / 12 (4,000,000,000 wrapped to a limit of
/// a few thousand lines in the harness).
pub const JOURNAL_BURST: u32 = 100_000_000;

/// The working directory of a job: the one it asked for, else its owner's
/// home when that exists, else `/`.
pub fn workdir(record: &JobRecord, home_exists: bool) -> PathBuf {
    match &record.spec.workdir {
        Some(dir) => dir.clone(),
        None if home_exists => record.owner.home.clone(),
        None => PathBuf::from("/"),
    }
}

/// The variables ptraind sets for every job, as unit properties (visible
/// to all, fixed names, values ptraind chose): which GPUs, the job's id and
/// where its result goes.
pub fn daemon_environment(record: &JobRecord, result_file: &Path) -> Vec<String> {
    let uuids: Vec<&str> = record.gpus.iter().map(|g| g.uuid.as_str()).collect();
    let indices: Vec<String> = record.gpus.iter().map(|g| g.index.to_string()).collect();
    // UUIDs name the same GPU for CUDA and NVML whatever the enumeration
    // order; PCI_BUS_ID order makes plain indices agree too.
    vec![
        format!("CUDA_VISIBLE_DEVICES={}", uuids.join(",")),
        "CUDA_DEVICE_ORDER=PCI_BUS_ID".into(),
        format!("PTRAIN_JOB_ID={}", record.id),
        // Which attempt this is (1 first): a retried script resumes from
        // its checkpoint when it is more.
        format!("PTRAIN_ATTEMPT={}", record.attempt),
        format!("PTRAIN_GPUS={}", indices.join(",")),
        format!("PTRAIN_RESULT_FILE={}", result_file.display()),
    ]
}

/// What the job's command runs with besides the unit's own variables: its
/// `env`, and its parents' results (private to the owner).
/// In an image, as `docker run` would: the image's `Entrypoint` before the
/// job's command (which replaces its `Cmd`), and the image's `Env` under
/// the job's `env`.
pub fn launch_file(record: &JobRecord, parent_results: Option<&str>) -> LaunchFile {
    let (argv, mut env) = match &record.image {
        Some(image) => (
            crate::images::manifest::launch_argv(&image.run, &record.spec.command)
                .unwrap_or_else(|_| record.spec.command.clone()),
            crate::images::manifest::merge_env(
                image.run.env.as_deref().unwrap_or_default(),
                &record.spec.env,
            )
            .into_iter()
            .collect(),
        ),
        None => (record.spec.command.clone(), record.spec.env.clone()),
    };
    if let Some(results) = parent_results {
        env.insert("PTRAIN_PARENT_RESULTS".into(), results.to_owned());
    }
    LaunchFile {
        argv,
        env,
        usage_dir: None,
    }
}

/// What a job's unit takes of the config: its own settings only
/// (`From<&Config>` is the config's).
#[derive(Clone, Copy, Debug)]
pub struct UnitSettings<'a> {
    /// `[jobs] slice`: where the job units run.
    pub slice: &'a str,
    /// `[jobs] stop_grace`: SIGTERM to SIGKILL (`TimeoutStopSec=`).
    pub stop_grace: std::time::Duration,
    /// `[jobs] max_stop_grace`: a job's own `stop_grace` is held to it
    /// (the admin may have lowered it since the job was admitted).
    pub max_stop_grace: std::time::Duration,
    /// The admin's data paths every job may write (`ReadWritePaths=`).
    pub read_write_paths: &'a [PathBuf],
    /// `[accounting] enabled`: `exec-job` leaves a usage watcher beside
    /// the command, one more task than the job's own.
    pub usage_watcher: bool,
}

/// What a launch needs besides the record and the settings.
pub struct LaunchContext<'a> {
    pub home_exists: bool,
    /// The ptraind binary: the unit's ExecStart is `ptraind exec-job`.
    pub ptraind: &'a Path,
    /// The launch credential and secrets, and the result directory
    /// ([`crate::runtime::JobRuntime::prepare`]).
    pub prepared: &'a PreparedLaunch,
    /// Where the job writes its result.
    pub result_file: &'a Path,
    /// How an image job's unit runs `ptraind` inside the image's root
    /// (`None`: this ptraind cannot tell; image jobs are refused before).
    pub host_exec: Option<&'a crate::runtime::HostExec>,
    /// An image job's GPUs as the host's CDI specs give them: its device
    /// nodes and the driver's files ([`crate::cdi`]).
    pub devices: Option<&'a crate::cdi::JobDevices>,
    /// The workdir an image job's unit binds at its own path (checked as
    /// its user just before: no symlink on the way).
    pub workdir_bind: Option<&'a Path>,
}

/// What an image job's command gets from its GPUs' CDI specs: their
/// variables, and the driver's library folders on `LD_LIBRARY_PATH` (after
/// the image's or the job's own), as the specs' `update-ldcache` hook
/// would have made them found. Into the launch file: the job's program
/// alone sees them.
pub fn add_device_environment(launch: &mut LaunchFile, devices: &crate::cdi::JobDevices) {
    for entry in &devices.environment {
        if let Some((name, value)) = entry.split_once('=') {
            launch.env.insert(name.to_owned(), value.to_owned());
        }
    }
    let existing = launch.env.get("LD_LIBRARY_PATH").map(String::as_str);
    if let Some(path) = devices.ld_library_path(existing) {
        launch.env.insert("LD_LIBRARY_PATH".into(), path);
    }
}

/// A name for the job's output in the journal (`SYSLOG_IDENTIFIER`, what
/// `journalctl` prints before each line): the command's base name when it
/// is plain, else "ptrain-job". Without it every line would say "ptraind",
/// the program systemd starts.
pub fn syslog_identifier(record: &JobRecord) -> String {
    let base = record.spec.command[0]
        .rsplit('/')
        .next()
        .unwrap_or_default();
    let plain = !base.is_empty()
        && base.len() <= 64
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b));
    if plain {
        base.to_owned()
    } else {
        "ptrain-job".into()
    }
}

/// SIGTERM to SIGKILL for this job.
pub fn stop_grace(record: &JobRecord, settings: UnitSettings<'_>) -> std::time::Duration {
    record
        .spec
        .stop_grace
        .map_or(settings.stop_grace, |own| own.min(settings.max_stop_grace))
}

pub fn job_unit_properties(
    record: &JobRecord,
    settings: UnitSettings<'_>,
    ctx: &LaunchContext,
) -> UnitProperties {
    let workdir = workdir(record, ctx.home_exists);
    let mut devices: Vec<(String, String)> = Vec::new();
    if let (Some(_), Some(cdi)) = (&record.image, ctx.devices) {
        // In an image, the nodes its GPUs' CDI devices name.
        devices.extend(cdi.device_allow.iter().cloned());
    } else if !record.gpus.is_empty() {
        devices.extend(
            NVIDIA_CONTROL_NODES
                .iter()
                .map(|n| (n.to_string(), "rw".into())),
        );
        devices.extend(
            record
                .gpus
                .iter()
                .map(|g| (g.device.display().to_string(), "rw".into())),
        );
    }
    let mut read_write: Vec<String> = vec![ctx.prepared.result_dir.display().to_string()];
    if workdir != Path::new("/") {
        read_write.push(workdir.display().to_string());
    }
    // A configured data path that does not exist on this host must not
    // stop every job: "-" makes it optional for systemd.
    read_write.extend(
        settings
            .read_write_paths
            .iter()
            .map(|p| format!("-{}", p.display())),
    );
    let ptraind = ctx.ptraind.display().to_string();
    // `ptraind ARGS` as the unit runs it: in an image's root, through the
    // host's loader on the host's files bound in ([`HostExec`]).
    let ptraind_command = |args: Vec<String>| -> (String, Vec<String>) {
        match (&record.image, ctx.host_exec) {
            (Some(_), Some(host)) => host.command(&args),
            _ => (ptraind.clone(), [vec![ptraind.clone()], args].concat()),
        }
    };
    let (exec_path, exec_argv) = ptraind_command(vec![
        "exec-job".into(),
        ctx.prepared.launch_file.display().to_string(),
    ]);
    let [on_success, on_failure] = record.id.recorder_units();
    let mut props: UnitProperties = vec![
        (
            "Description",
            PropValue::Str(format!("ptrain job {} of {}", record.id, record.owner.name)),
        ),
        ("Type", PropValue::Str("exec".into())),
        // `ptraind exec-job` reads the command from the launch file and
        // execs it, as the job's user: no argument here holds a byte of the
        // user's (the path is made of the checked id), so none can be
        // expanded or misread on reload.
        (
            "ExecStart",
            PropValue::Exec(vec![(exec_path, exec_argv, false)]),
        ),
        ("CPUAccounting", PropValue::Bool(true)),
        ("MemoryAccounting", PropValue::Bool(true)),
        ("IOAccounting", PropValue::Bool(true)),
        // The end is recorded by a unit of its own (units/ptrain-exit@.service)
        // whose facts come from systemd, not by a command inside this unit,
        // which would share the job's environment.
        ("OnSuccess", PropValue::StrList(vec![on_success])),
        ("OnFailure", PropValue::StrList(vec![on_failure])),
        ("User", PropValue::Str(record.owner.uid.to_string())),
        ("Group", PropValue::Str(record.owner.gid.to_string())),
        (
            "SupplementaryGroups",
            PropValue::StrList(record.owner.groups.iter().map(u32::to_string).collect()),
        ),
        (
            "WorkingDirectory",
            PropValue::Str(workdir.display().to_string()),
        ),
        (
            "Environment",
            PropValue::StrList(daemon_environment(record, ctx.result_file)),
        ),
        ("StandardOutput", PropValue::Str("journal".into())),
        (
            "SyslogIdentifier",
            PropValue::Str(syslog_identifier(record)),
        ),
        // A job's output is its record: journald's default rate limit
        // (10,000 lines in 30 s, scaled by free space) silently drops most
        // of a fast one, and says so only if the job writes again after
        // the interval. An interval of 0 does not turn it off (systemd
        // 252 takes 0 as "unset"); a burst journald cannot reach does.
        ("LogRateLimitBurst", PropValue::U32(JOURNAL_BURST)),
        // `journalctl PTRAIN_JOB=ID` shows the job's output next to
        // ptraind's own entries about it.
        (
            "LogExtraFields",
            PropValue::ByteStrings(vec![format!("PTRAIN_JOB={}", record.id).into_bytes()]),
        ),
        ("StandardError", PropValue::Str("journal".into())),
        ("Slice", PropValue::Str(settings.slice.to_owned())),
        // Once we release our reference, systemd drops the unit even if it
        // failed: ptraind has recorded the result by then, and failed job
        // units must not pile up.
        ("CollectMode", PropValue::Str("inactive-or-failed".into())),
        // The confinement baseline.
        ("NoNewPrivileges", PropValue::Bool(true)),
        ("PrivateTmp", PropValue::Bool(true)),
        // Writable: the workdir, the result directory and the admin's data
        // paths; nothing else, the owner's home and /run/user included.
        ("ProtectSystem", PropValue::Str("strict".into())),
        ("ProtectHome", PropValue::Str("read-only".into())),
        ("ReadWritePaths", PropValue::StrList(read_write)),
        // Shared memory of the job's own (PyTorch's DataLoader needs a
        // writable /dev/shm), gone with it, never shared with other users'
        // jobs: a private IPC namespace, a private tmpfs on /dev/shm, and the
        // host's POSIX message queue file system out of reach.
        ("PrivateIPC", PropValue::Bool(true)),
        (
            "TemporaryFileSystem",
            PropValue::Pairs(vec![("/dev/shm".into(), "mode=1777,nosuid,nodev".into())]),
        ),
        (
            "InaccessiblePaths",
            PropValue::StrList(vec!["-/dev/mqueue".into()]),
        ),
        ("ProtectKernelTunables", PropValue::Bool(true)),
        ("ProtectKernelModules", PropValue::Bool(true)),
        ("ProtectKernelLogs", PropValue::Bool(true)),
        ("ProtectControlGroups", PropValue::Bool(true)),
        ("RestrictSUIDSGID", PropValue::Bool(true)),
        ("LockPersonality", PropValue::Bool(true)),
        // CUDA_VISIBLE_DEVICES isolates nothing (a job can unset it); the
        // device cgroup does.
        ("DevicePolicy", PropValue::Str("closed".into())),
        ("DeviceAllow", PropValue::Pairs(devices)),
        // SIGTERM, then SIGKILL after the job's grace (the admin's by
        // default, never more than the admin's maximum): a job that ignores
        // SIGTERM does not keep its GPUs systemd's default 90 s.
        (
            "TimeoutStopUSec",
            PropValue::U64(stop_grace(record, settings).as_micros() as u64),
        ),
    ];
    if let Some(image) = &record.image {
        props.extend(image_properties(image, ctx));
    }
    let limits = &record.limits;
    if let Some(bytes) = limits.memory_bytes {
        props.push(("MemoryMax", PropValue::U64(bytes)));
    }
    if let Some(tasks) = limits.tasks {
        // The job's own tasks, and the usage watcher beside them.
        let watcher = u64::from(settings.usage_watcher);
        props.push(("TasksMax", PropValue::U64(tasks.saturating_add(watcher))));
    }
    if let Some(millicpus) = limits.millicpus {
        props.push(("CPUQuotaPerSecUSec", PropValue::U64(millicpus * 1000)));
    }
    if let Some(timeout) = record.spec.timeout {
        props.push(("RuntimeMaxUSec", PropValue::U64(timeout.as_micros() as u64)));
    }
    props
}

/// What runs a job inside its image (issue 21): the image's root for the
/// unit's whole mount namespace, with the API file systems (`/proc`,
/// `/sys`, `/dev`, and a tmpfs on `/run`) and the job's own paths bound in
/// at the same place: its workdir and result directory writable, its
/// launch directory (command, environment, secrets) and the host's
/// `ptraind` read-only. Every other property, the baseline, the
/// device allow-list and the limits among them, is the same as on the
/// host: ProtectSystem=strict makes the image read-only on top of its
/// files being root's.
fn image_properties(image: &crate::store::ReadyImage, ctx: &LaunchContext) -> UnitProperties {
    let same = |p: &Path| (p.display().to_string(), p.display().to_string(), false, 0);
    let mut read_only: Vec<(String, String, bool, u64)> = ctx
        .host_exec
        .map(|host| {
            host.binds()
                .into_iter()
                .map(|(source, dest)| (source.display().to_string(), dest, false, 0))
                .collect()
        })
        .unwrap_or_default();
    if let Some(launch_dir) = ctx.prepared.launch_file.parent() {
        read_only.push(same(launch_dir));
    }
    if let Some(devices) = ctx.devices {
        read_only.extend(devices.binds.iter().map(crate::cdi::BindMount::dbus));
    }
    // The workdir, at its own path. systemd resolves the source as root
    // when the unit starts: the daemon checked just before, as the job's
    // user, that no directory of the path is a symlink
    // ([`crate::images::runtime_root::check_workdir_as`]); see SECURITY.md
    // for the window left between the two.
    let mut writable = vec![same(&ctx.prepared.result_dir)];
    if let Some(workdir) = ctx.workdir_bind {
        writable.push(same(workdir));
    }
    vec![
        (
            "RootDirectory",
            PropValue::Str(image.rootfs.display().to_string()),
        ),
        ("MountAPIVFS", PropValue::Bool(true)),
        ("BindReadOnlyPaths", PropValue::Binds(read_only)),
        ("BindPaths", PropValue::Binds(writable)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{test_kit, AssignedGpu};
    use crate::users::Owner;

    fn record(json: &str) -> JobRecord {
        let owner = Owner {
            gid: 4321,
            groups: vec![27],
            ..test_kit::owner(1234, "alice")
        };
        test_kit::record(json, "job1", owner, 0)
    }

    fn prepared() -> PreparedLaunch {
        PreparedLaunch {
            launch_file: "/run/ptrain/launch/job1/ptrain.job".into(),
            result_dir: "/run/ptrain/results/job1".into(),
        }
    }

    fn props(r: &JobRecord, config: &crate::config::Config, home_exists: bool) -> UnitProperties {
        let prepared = prepared();
        let ctx = LaunchContext {
            home_exists,
            ptraind: Path::new("/usr/sbin/ptraind"),
            prepared: &prepared,
            result_file: Path::new("/run/ptrain/results/job1/result.json"),
            host_exec: Some(&host_exec()),
            devices: None,
            workdir_bind: Some(Path::new("/home/alice/p")),
        };
        job_unit_properties(r, config.into(), &ctx)
    }

    fn host_exec() -> crate::runtime::HostExec {
        crate::runtime::HostExec {
            ptraind: "/usr/sbin/ptraind".into(),
            loader: "/lib64/ld-linux-x86-64.so.2".into(),
            lib_dir: "/lib/x86_64-linux-gnu".into(),
        }
    }

    #[test]
    fn an_image_job_runs_ptraind_through_the_hosts_loader_in_the_images_root() {
        let config = crate::config::Config::from_toml(Path::new("t"), "").unwrap();
        let host = record(
            r#"{"version":1,"command":["train.py","--lr","0.1"],"workdir":"/home/alice/p","env":{"A":"job","PATH":"/opt/bin"}}"#,
        );
        let host_props = props(&host, &config, true);
        for key in [
            "RootDirectory",
            "MountAPIVFS",
            "BindPaths",
            "BindReadOnlyPaths",
        ] {
            assert!(host_props.iter().all(|(k, _)| *k != key), "{key}");
        }
        let mut r = record(
            r#"{"version":1,"image":"localhost:5000/ptrain/test:v1","command":["train.py","--lr","0.1"],"workdir":"/home/alice/p","env":{"A":"job","PATH":"/opt/bin"}}"#,
        );
        r.image = Some(crate::store::ReadyImage {
            digest: format!("sha256:{}", "a".repeat(64)),
            rootfs: "/var/lib/ptrain/images/roots/sha256/k".into(),
            run: crate::images::manifest::RunConfig {
                env: Some(vec![
                    "PATH=/usr/bin:/bin".into(),
                    "LANG=C.UTF-8".into(),
                    "A=image".into(),
                ]),
                entrypoint: Some(vec!["/usr/bin/python3".into()]),
                cmd: Some(vec!["-c".into(), "print(1)".into()]),
                ..Default::default()
            },
        });
        let props = props(&r, &config, true);
        assert_eq!(
            get(&props, "RootDirectory"),
            &PropValue::Str("/var/lib/ptrain/images/roots/sha256/k".into())
        );
        assert_eq!(get(&props, "MountAPIVFS"), &PropValue::Bool(true));
        let PropValue::Exec(exec) = get(&props, "ExecStart") else {
            panic!("ExecStart");
        };
        assert_eq!(exec[0].0, "/run/ptrain-host/ld.so");
        assert_eq!(
            exec[0].1[3..],
            [
                "/run/ptrain-host/ptraind",
                "exec-job",
                "/run/ptrain/launch/job1/ptrain.job"
            ]
        );
        let same = |p: &str| (p.to_string(), p.to_string(), false, 0);
        assert_eq!(
            get(&props, "BindPaths"),
            &PropValue::Binds(vec![
                same("/run/ptrain/results/job1"),
                same("/home/alice/p")
            ])
        );
        let PropValue::Binds(ro) = get(&props, "BindReadOnlyPaths") else {
            panic!("BindReadOnlyPaths");
        };
        assert!(ro.contains(&same("/run/ptrain/launch/job1")), "{ro:?}");
        let PropValue::StrList(rw) = get(&props, "ReadWritePaths") else {
            panic!("ReadWritePaths");
        };
        assert!(rw.contains(&"/home/alice/p".to_string()), "{rw:?}");
        assert!(ro.contains(&(
            "/usr/sbin/ptraind".to_string(),
            "/run/ptrain-host/ptraind".to_string(),
            false,
            0
        )));
        // The baseline is the host job's, property for property.
        for (key, value) in &host_props {
            if !matches!(*key, "ExecStart" | "ExecStopPost") {
                assert_eq!(get(&props, key), value, "{key}");
            }
        }
        // docker run's rules: the entrypoint kept, the command for Cmd,
        // the job's env over the image's.
        let launch = launch_file(&r, None);
        assert_eq!(launch.argv, ["/usr/bin/python3", "train.py", "--lr", "0.1"]);
        assert_eq!(launch.env["A"], "job");
        assert_eq!(launch.env["PATH"], "/opt/bin");
        assert_eq!(launch.env["LANG"], "C.UTF-8");
    }

    fn get<'a>(props: &'a UnitProperties, key: &str) -> &'a PropValue {
        &props
            .iter()
            .find(|(k, _)| *k == key)
            .unwrap_or_else(|| panic!("{key} missing"))
            .1
    }

    #[test]
    fn identity_is_numeric_and_baseline_present() {
        let config = crate::config::Config::from_toml(Path::new("t"), "").unwrap();
        let mut r = record(
            r#"{"version":1,"command":["python3","train.py"],"workdir":"/home/alice/p","timeout":"90m","env":{"A":"b"}}"#,
        );
        r.gpus = vec![AssignedGpu {
            index: 1,
            uuid: "GPU-1".into(),
            device: "/dev/nvidia1".into(),
        }];
        let props = props(&r, &config, true);
        assert_eq!(get(&props, "User"), &PropValue::Str("1234".into()));
        assert_eq!(get(&props, "Group"), &PropValue::Str("4321".into()));
        assert_eq!(
            get(&props, "WorkingDirectory"),
            &PropValue::Str("/home/alice/p".into())
        );
        assert_eq!(
            get(&props, "RuntimeMaxUSec"),
            &PropValue::U64(90 * 60 * 1_000_000)
        );
        assert_eq!(
            get(&props, "DevicePolicy"),
            &PropValue::Str("closed".into())
        );
        let PropValue::Pairs(devs) = get(&props, "DeviceAllow") else {
            panic!()
        };
        assert!(devs.iter().any(|(d, _)| d == "/dev/nvidia1"));
        assert!(!devs.iter().any(|(d, _)| d == "/dev/nvidia0"));
        for key in [
            "NoNewPrivileges",
            "PrivateTmp",
            "ProtectKernelTunables",
            "RestrictSUIDSGID",
        ] {
            assert_eq!(get(&props, key), &PropValue::Bool(true), "{key}");
        }
        let PropValue::StrList(env) = get(&props, "Environment") else {
            panic!()
        };
        assert!(env.contains(&"CUDA_VISIBLE_DEVICES=GPU-1".to_string()));
        assert!(env.contains(&"PTRAIN_JOB_ID=job1".to_string()));
        assert!(env.contains(&"PTRAIN_GPUS=1".to_string()));
        assert!(
            env.contains(&"PTRAIN_RESULT_FILE=/run/ptrain/results/job1/result.json".to_string())
        );
        // The job's own variables and its command are no unit property.
        assert!(!env.iter().any(|e| e.starts_with("A=")), "{env:?}");
        let shown = format!("{props:?}");
        assert!(!shown.contains("train.py"), "{shown}");
        assert_eq!(
            get(&props, "ExecStart"),
            &PropValue::Exec(vec![(
                "/usr/sbin/ptraind".into(),
                vec![
                    "/usr/sbin/ptraind".into(),
                    "exec-job".into(),
                    "/run/ptrain/launch/job1/ptrain.job".into()
                ],
                false
            )])
        );
        assert_eq!(
            get(&props, "OnFailure"),
            &PropValue::StrList(vec!["ptrain-exit@failed-job1.service".into()])
        );
        assert_eq!(
            get(&props, "OnSuccess"),
            &PropValue::StrList(vec!["ptrain-exit@ok-job1.service".into()])
        );
        assert_eq!(
            get(&props, "SyslogIdentifier"),
            &PropValue::Str("python3".into())
        );
        assert_eq!(get(&props, "TimeoutStopUSec"), &PropValue::U64(30_000_000));
        let launch = launch_file(&r, Some("{}"));
        assert_eq!(launch.argv, ["python3", "train.py"]);
        assert_eq!(launch.env["A"], "b");
        assert_eq!(launch.env["PTRAIN_PARENT_RESULTS"], "{}");
    }

    #[test]
    fn the_admins_slice_grace_and_data_paths_reach_every_unit() {
        let text = "slice = \"gpu-jobs.slice\"\n[jobs]\nstop_grace = \"2m\"\nread_write_paths = [\"/data\", \"/scratch\"]\n";
        let config = crate::config::Config::from_toml(Path::new("t"), text).unwrap();
        let r = record(r#"{"version":1,"command":["true"]}"#);
        let props = props(&r, &config, true);
        assert_eq!(
            get(&props, "Slice"),
            &PropValue::Str("gpu-jobs.slice".into())
        );
        assert_eq!(get(&props, "TimeoutStopUSec"), &PropValue::U64(120_000_000));
        let PropValue::StrList(paths) = get(&props, "ReadWritePaths") else {
            panic!("ReadWritePaths is a list");
        };
        // Optional for systemd ("-"): a path missing on this host stops no job.
        assert!(paths.contains(&"-/data".to_string()), "{paths:?}");
        assert!(paths.contains(&"-/scratch".to_string()), "{paths:?}");
    }

    #[test]
    fn the_unit_counts_its_usage_and_runs_no_second_command_to_read_it() {
        // The figures are read by the watcher `exec-job` leaves behind:
        // an `ExecStopPost=` would set the sandbox up a second time.
        for text in ["", "[accounting]\nenabled = false\n"] {
            let config = crate::config::Config::from_toml(Path::new("t"), text).unwrap();
            let r = record(r#"{"version":1,"command":["true"]}"#);
            let props = props(&r, &config, true);
            for key in ["CPUAccounting", "MemoryAccounting", "IOAccounting"] {
                assert_eq!(get(&props, key), &PropValue::Bool(true), "{key}");
            }
            assert!(props.iter().all(|(k, _)| *k != "ExecStopPost"), "{text}");
        }
        let r = record(r#"{"version":1,"command":["true"]}"#);
        assert_eq!(launch_file(&r, None).usage_dir, None);
    }

    #[test]
    fn no_property_carries_what_systemd_252_cannot_read_back() {
        // `$`, `%` or a flag list (ExecStartEx) in a property of a
        // transient unit break its reload; none may come from the job.
        let config = crate::config::Config::from_toml(Path::new("t"), "").unwrap();
        let r =
            record(r#"{"version":1,"command":["sh","-c","echo $HOME %h $$"],"env":{"X":"$Y %n"}}"#);
        for (key, value) in props(&r, &config, true) {
            let text = format!("{value:?}");
            assert!(!key.ends_with("Ex"), "{key}");
            assert!(!text.contains('$') && !text.contains('%'), "{key}: {text}");
        }
    }

    #[test]
    fn no_gpus_means_no_nvidia_nodes_and_empty_cuda_list() {
        let config = crate::config::Config::from_toml(Path::new("t"), "").unwrap();
        let r = record(r#"{"version":1,"command":["true"]}"#);
        let props = props(&r, &config, false);
        assert_eq!(get(&props, "DeviceAllow"), &PropValue::Pairs(vec![]));
        assert_eq!(get(&props, "WorkingDirectory"), &PropValue::Str("/".into()));
        assert!(!props.iter().any(|(k, _)| *k == "RuntimeMaxUSec"));
    }
}
