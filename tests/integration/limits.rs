//! Issue 3: per-job resource limits from config, capped per user.

use crate::daemon::{Opts, TestDaemon, ALICE, BOB};

#[test]
fn resource_requests_are_capped_per_user_and_land_on_the_unit() {
    let d = TestDaemon::start_with(
        "limits",
        Opts {
            extra_config: "[limits]\nmemory_max = \"1G\"\ncpus_max = 2\ntasks_max = 64\n[limits.users.ptrain-alice]\nmemory_max = \"2G\"\n"
                .into(),
            ..Opts::default()
        },
    );
    d.drop_job(
        ALICE,
        "big.json",
        r#"{"version": 1, "command": ["sleep", "60"], "resources": {"memory": "1536M", "cpus": 1.5}}"#,
    );
    d.wait_running("big");
    let unit = "ptrain-job@big.service";
    assert_eq!(
        d.unit_property(unit, "MemoryMax"),
        (1536u64 << 20).to_string()
    );
    assert_eq!(d.unit_property(unit, "CPUQuotaPerSecUSec"), "1.500000s");
    // The job's 64 and the usage watcher beside them (accounting is on).
    assert_eq!(d.unit_property(unit, "TasksMax"), "65");
    // Asking nothing gets the caps.
    d.drop_job(
        BOB,
        "plain.json",
        r#"{"version": 1, "command": ["sleep", "60"]}"#,
    );
    d.wait_running("plain");
    assert_eq!(
        d.unit_property("ptrain-job@plain.service", "MemoryMax"),
        (1u64 << 30).to_string()
    );
    assert_eq!(
        d.unit_property("ptrain-job@plain.service", "CPUQuotaPerSecUSec"),
        "2s"
    );
    // Bob's cap is the global 1G: his 1.5G request is refused with the reason.
    d.drop_job(
        BOB,
        "greedy.json",
        r#"{"version": 1, "command": ["true"], "resources": {"memory": "1536M"}}"#,
    );
    let r = d.wait_rejected(BOB, "greedy.json");
    let reason = r["reason"].as_str().unwrap();
    assert!(
        reason.contains("memory") && reason.contains("limits"),
        "{reason}"
    );
    assert!(d.status("greedy").is_none());
}
