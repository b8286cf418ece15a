//! The transient unit a job runs as, built from its record. Pure: the
//! properties are plain values here and become D-Bus variants in
//! [`crate::systemd`].
//!
//! Every job unit carries a confinement baseline that nothing in the job
//! file can loosen: the descriptor has no field that reaches these
//! properties, and user environment entries cannot name the daemon's
//! variables (the spec rejects them).

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::gpu::NVIDIA_CONTROL_NODES;
use crate::store::JobRecord;

#[derive(Clone, Debug, PartialEq)]
pub enum PropValue {
    Str(String),
    Bool(bool),
    U64(u64),
    U32(u32),
    /// An array of byte strings (`aay`), e.g. LogExtraFields.
    ByteStrings(Vec<Vec<u8>>),
    StrList(Vec<String>),
    /// ExecStartEx: (path, argv, flags).
    Exec(Vec<(String, Vec<String>, Vec<String>)>),
    /// DeviceAllow: (node, "rw").
    DeviceAllow(Vec<(String, String)>),
}

pub type UnitProperties = Vec<(&'static str, PropValue)>;

/// The working directory of a job: the one it asked for, else its owner's
/// home when that exists, else `/`.
pub fn workdir(record: &JobRecord, home_exists: bool) -> PathBuf {
    match &record.spec.workdir {
        Some(dir) => dir.clone(),
        None if home_exists => record.owner.home.clone(),
        None => PathBuf::from("/"),
    }
}

/// The environment the daemon sets; user entries come first so the
/// daemon's own always win (the spec already rejects those names).
pub fn environment(record: &JobRecord, parent_results: Option<&str>) -> Vec<String> {
    let mut env: Vec<String> = record
        .spec
        .env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let uuids: Vec<&str> = record.gpus.iter().map(|g| g.uuid.as_str()).collect();
    let indices: Vec<String> = record.gpus.iter().map(|g| g.index.to_string()).collect();
    // UUIDs name the same GPU for CUDA and NVML whatever the enumeration
    // order; PCI_BUS_ID order makes plain indices agree too.
    env.push(format!("CUDA_VISIBLE_DEVICES={}", uuids.join(",")));
    env.push("CUDA_DEVICE_ORDER=PCI_BUS_ID".into());
    env.push(format!("PTRAIN_JOB_ID={}", record.id));
    env.push(format!("PTRAIN_GPUS={}", indices.join(",")));
    env.push(format!(
        "PTRAIN_RESULT_FILE={}",
        result_file(record).display()
    ));
    if let Some(results) = parent_results {
        env.push(format!("PTRAIN_PARENT_RESULTS={results}"));
    }
    env
}

/// What a launch needs besides the record and the config.
pub struct LaunchContext<'a> {
    pub home_exists: bool,
    /// The ptraind binary: the unit runs `ptraind record-exit` as its
    /// ExecStopPost, so the true exit survives a daemon that is down when
    /// the job ends (systemd may collect the unit before ptraind is back).
    pub recorder: &'a Path,
    /// JSON of the parents' results, for `PTRAIN_PARENT_RESULTS`.
    pub parent_results: Option<String>,
}

/// Where a job may write its results (a JSON object): a runtime directory
/// systemd creates for the job's user and removes after the exit recorder
/// has read it.
pub fn runtime_dir_name(record: &JobRecord) -> String {
    format!("ptrain-job-{}", record.id)
}

pub fn result_file(record: &JobRecord) -> PathBuf {
    Path::new("/run")
        .join(runtime_dir_name(record))
        .join("result.json")
}

pub fn job_unit_properties(
    record: &JobRecord,
    config: &Config,
    ctx: &LaunchContext,
) -> UnitProperties {
    let recorder = ctx.recorder;
    let workdir = workdir(record, ctx.home_exists);
    let argv = record.spec.command.clone();
    let mut devices: Vec<(String, String)> = Vec::new();
    if !record.gpus.is_empty() {
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
    let mut read_write: Vec<String> = Vec::new();
    if workdir != Path::new("/") {
        read_write.push(workdir.display().to_string());
    }
    // A configured data path that does not exist on this host must not
    // stop every job: "-" makes it optional for systemd.
    read_write.extend(
        config
            .read_write_paths
            .iter()
            .map(|p| format!("-{}", p.display())),
    );
    let mut props: UnitProperties = vec![
        (
            "Description",
            PropValue::Str(format!("ptrain job {} of {}", record.id, record.owner.name)),
        ),
        ("Type", PropValue::Str("exec".into())),
        // argv is passed as written: "no-env-expand" keeps systemd from
        // expanding `$VAR` (and turning `$$` into `$`) in the user's command.
        (
            "ExecStartEx",
            PropValue::Exec(vec![(argv[0].clone(), argv, vec!["no-env-expand".into()])]),
        ),
        // Numeric ids: a user name systemd cannot parse would make it run
        // the job as root (CVE-2017-1000082).
        (
            "ExecStopPostEx",
            PropValue::Exec(vec![(
                recorder.display().to_string(),
                vec![
                    recorder.display().to_string(),
                    "record-exit".into(),
                    "--state-dir".into(),
                    config.state_dir.display().to_string(),
                    "--job".into(),
                    record.id.to_string(),
                    "--result-file".into(),
                    result_file(record).display().to_string(),
                    "--uid".into(),
                    record.owner.uid.to_string(),
                    "--gid".into(),
                    record.owner.gid.to_string(),
                ],
                // Root, outside the job's sandbox (it writes the root-only
                // state dir); a failure must not change the job's result.
                vec![
                    "privileged".into(),
                    "ignore-failure".into(),
                    "no-env-expand".into(),
                ],
            )]),
        ),
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
            PropValue::StrList(environment(record, ctx.parent_results.as_deref())),
        ),
        (
            "RuntimeDirectory",
            PropValue::StrList(vec![runtime_dir_name(record)]),
        ),
        ("RuntimeDirectoryMode", PropValue::U32(0o700)),
        ("StandardOutput", PropValue::Str("journal".into())),
        // `journalctl PTRAIN_JOB=ID` shows the job's output next to
        // ptraind's own entries about it.
        (
            "LogExtraFields",
            PropValue::ByteStrings(vec![format!("PTRAIN_JOB={}", record.id).into_bytes()]),
        ),
        ("StandardError", PropValue::Str("journal".into())),
        ("Slice", PropValue::Str(config.slice.clone())),
        // Once we release our reference, systemd drops the unit even if it
        // failed: ptraind has recorded the result by then, and failed job
        // units must not pile up.
        ("CollectMode", PropValue::Str("inactive-or-failed".into())),
        // The confinement baseline.
        ("NoNewPrivileges", PropValue::Bool(true)),
        ("PrivateTmp", PropValue::Bool(true)),
        ("ProtectSystem", PropValue::Str("strict".into())),
        ("ReadWritePaths", PropValue::StrList(read_write)),
        ("ProtectKernelTunables", PropValue::Bool(true)),
        ("ProtectKernelModules", PropValue::Bool(true)),
        ("ProtectKernelLogs", PropValue::Bool(true)),
        ("ProtectControlGroups", PropValue::Bool(true)),
        ("RestrictSUIDSGID", PropValue::Bool(true)),
        ("LockPersonality", PropValue::Bool(true)),
        // CUDA_VISIBLE_DEVICES isolates nothing (a job can unset it); the
        // device cgroup does.
        ("DevicePolicy", PropValue::Str("closed".into())),
        ("DeviceAllow", PropValue::DeviceAllow(devices)),
    ];
    let limits = &record.limits;
    if let Some(bytes) = limits.memory_bytes {
        props.push(("MemoryMax", PropValue::U64(bytes)));
    }
    if let Some(tasks) = limits.tasks {
        props.push(("TasksMax", PropValue::U64(tasks)));
    }
    if let Some(millicpus) = limits.millicpus {
        props.push(("CPUQuotaPerSecUSec", PropValue::U64(millicpus * 1000)));
    }
    if let Some(timeout) = record.spec.timeout {
        props.push(("RuntimeMaxUSec", PropValue::U64(timeout.as_micros() as u64)));
    }
    props
}

/// What systemd's special exit statuses (set when it fails to set up the
/// process, before the command runs) mean for a user.
pub fn explain_exit_status(status: i32) -> Option<&'static str> {
    Some(match status {
        200 => "the working directory does not exist or is not accessible to the job's user",
        203 => "the command was not found or is not executable by the job's user",
        216 => "the job's group could not be set",
        217 => "the job's user could not be set",
        226 => "a path in ReadWritePaths (the workdir) does not exist",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse_spec;
    use crate::store::{AssignedGpu, SpoolSource};
    use crate::users::Owner;

    fn record(json: &str) -> JobRecord {
        let spec = parse_spec(json.as_bytes(), "job1").unwrap();
        let owner = Owner {
            uid: 1234,
            gid: 4321,
            name: "alice".into(),
            home: "/home/alice".into(),
            groups: vec![27],
        };
        let source = SpoolSource {
            file: "job1.json".into(),
            dev: 0,
            ino: 0,
            ctime_ns: 0,
            size: 0,
        };
        JobRecord::new(spec, owner, source, 0)
    }

    fn ctx(home_exists: bool) -> LaunchContext<'static> {
        LaunchContext {
            home_exists,
            recorder: Path::new("/usr/sbin/ptraind"),
            parent_results: None,
        }
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
        let config = Config::from_toml(Path::new("t"), "").unwrap();
        let mut r = record(
            r#"{"version":1,"command":["python3","train.py"],"workdir":"/home/alice/p","timeout":"90m","env":{"A":"b"}}"#,
        );
        r.gpus = vec![AssignedGpu {
            index: 1,
            uuid: "GPU-1".into(),
            device: "/dev/nvidia1".into(),
        }];
        let props = job_unit_properties(&r, &config, &ctx(true));
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
        let PropValue::DeviceAllow(devs) = get(&props, "DeviceAllow") else {
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
        assert!(env.contains(&"PTRAIN_RESULT_FILE=/run/ptrain-job-job1/result.json".to_string()));
    }

    #[test]
    fn no_gpus_means_no_nvidia_nodes_and_empty_cuda_list() {
        let config = Config::from_toml(Path::new("t"), "").unwrap();
        let r = record(r#"{"version":1,"command":["true"]}"#);
        let props = job_unit_properties(&r, &config, &ctx(false));
        assert_eq!(get(&props, "DeviceAllow"), &PropValue::DeviceAllow(vec![]));
        assert_eq!(get(&props, "WorkingDirectory"), &PropValue::Str("/".into()));
        assert!(!props.iter().any(|(k, _)| *k == "RuntimeMaxUSec"));
    }
}
