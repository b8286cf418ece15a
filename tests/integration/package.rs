//! The Debian package as an admin meets it: built by packaging/build-deb.sh
//! (from the test's debug binaries), installed with `dpkg -i` into a
//! harness's systemd, configured, given every spool example, scraped over
//! HTTP, then removed (data kept) and purged (nothing left).
//!
//! The harness shares the host's root file system, so the install is real
//! on the host too. The test refuses to run where ptrain is installed or
//! its directories hold anything, and a guard purges the package and puts
//! back what it found if the test fails half-way.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::daemon::{chown, text, ALICE, PTRAIN, PTRAIND};
use crate::harness::{ensure_user, repo_root, wait_for, Harness};
use crate::test_server::free_port;

/// What the package creates outside its own files, and purge removes.
const DATA_DIRS: [&str; 4] = [
    "/etc/ptrain",
    "/var/lib/ptrain",
    "/var/log/ptrain",
    "/var/spool/ptrain",
];
const WAIT: Duration = Duration::from_secs(60);
/// PATH for dpkg and the maintainer scripts (ldconfig, start-stop-daemon).
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// An empty directory the test found (and must leave) on the host.
struct Existing {
    path: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
}

/// Purges the package from the host and restores the directories found
/// before, whatever happened to the test.
struct HostGuard {
    existing: Vec<Existing>,
}

impl HostGuard {
    /// Refuses to touch a host where ptrain is installed or has data.
    fn claim() -> HostGuard {
        let status = package_status();
        assert!(
            status.is_empty() || status == "not-installed",
            "the ptrain package is on this host ({status}); this test installs and purges it: \
             run `dpkg --purge ptrain` first"
        );
        let mut existing = Vec::new();
        for path in DATA_DIRS {
            let Ok(meta) = std::fs::symlink_metadata(path) else {
                continue;
            };
            use std::os::unix::fs::MetadataExt;
            let empty =
                meta.is_dir() && std::fs::read_dir(path).is_ok_and(|mut d| d.next().is_none());
            assert!(
                empty,
                "{path} exists and is not an empty directory; this test purges the ptrain \
                 package, which deletes it: move it away first"
            );
            existing.push(Existing {
                path,
                mode: meta.mode() & 0o7777,
                uid: meta.uid(),
                gid: meta.gid(),
            });
        }
        HostGuard { existing }
    }
}

impl Drop for HostGuard {
    fn drop(&mut self) {
        let status = package_status();
        if !status.is_empty() && status != "not-installed" {
            // Outside the harness: the maintainer scripts find no running
            // systemd and only remove files.
            let _ = Command::new("dpkg")
                .args(["--purge", "ptrain"])
                .env("PATH", PATH)
                .stdin(Stdio::null())
                .output();
        }
        // What the package left (after a purge, nothing), then the empty
        // directories that were there before.
        for path in DATA_DIRS {
            let _ = std::fs::remove_dir_all(path);
        }
        for e in &self.existing {
            let _ = std::fs::create_dir_all(e.path);
            let _ = std::fs::set_permissions(e.path, std::fs::Permissions::from_mode(e.mode));
            let _ = std::os::unix::fs::chown(e.path, Some(e.uid), Some(e.gid));
        }
    }
}

/// lintian finds no error and no warning in the package (the overrides it
/// ships say why each one left is wrong for ptrain). Info tags pass.
fn lintian_clean(deb: &str) {
    let out = Command::new("lintian")
        .args(["--fail-on", "error,warning", "--no-tag-display-limit", deb])
        .env("PATH", PATH)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run lintian ({e}); install it: apt-get install lintian (tests/install-deps.sh does)")
        });
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && !report
                .lines()
                .any(|l| l.starts_with("E: ") || l.starts_with("W: ")),
        "lintian {deb} ({}):\n{report}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// dpkg's word for the package's state: "installed", "config-files", ""
/// when dpkg never heard of it.
fn package_status() -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Status}", "ptrain"])
        .stdin(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Runs `program` inside the harness, as root, with a sane PATH.
fn inside(h: &Harness, program: &str, args: &[&str]) -> Output {
    h.command(program)
        .args(args)
        .env("PATH", PATH)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} in the harness: {e}"))
}

fn succeed(out: Output, what: &str) -> String {
    assert!(out.status.success(), "{what} failed: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn systemctl_value(h: &Harness, verb: &str, unit: &str) -> String {
    let (_, out) = h.systemctl(&[verb, unit]);
    out.trim().to_owned()
}

/// Every job file of spool-examples/ (recursively), each with its job id,
/// in an order that submits a job's dependencies before it.
fn examples() -> Vec<(PathBuf, String, Value)> {
    let mut files = Vec::new();
    let mut dirs = vec![repo_root().join("spool-examples")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                let spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap())
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                // An image example names a registry this test must not
                // reach (traffic stays on loopback): the images' own
                // tests run images, `spec::tests` checks the file.
                if spec.get("image").is_some() {
                    continue;
                }
                let id = spec["id"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| path.file_stem().unwrap().to_string_lossy().into_owned());
                files.push((path, id, spec));
            }
        }
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    let mut ordered: Vec<(PathBuf, String, Value)> = Vec::new();
    while !files.is_empty() {
        let known: BTreeSet<String> = ordered.iter().map(|(_, id, _)| id.clone()).collect();
        let ready = files
            .iter()
            .position(|(_, _, spec)| {
                ["after_ok", "after_fail", "after_any"].iter().all(|k| {
                    spec[k]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .all(|dep| known.contains(dep.as_str().unwrap_or("")))
                })
            })
            .expect("spool-examples: a dependency no example provides");
        ordered.push(files.remove(ready));
    }
    ordered
}

/// `GET path` over plain HTTP/1.1; (status code, body).
pub(crate) fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, body.to_owned()))
}

/// name{labels} → value of every sample.
pub(crate) fn samples(exposition: &str) -> BTreeMap<String, f64> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

pub(crate) fn metric(s: &BTreeMap<String, f64>, series: &str) -> f64 {
    *s.get(series)
        .unwrap_or_else(|| panic!("no {series} in the metrics:\n{s:#?}"))
}

// It installs into the host's file system, which every harness shares
// (/lib/systemd/system, /etc/systemd/system, /var/lib/ptrain): run alone,
// after the parallel tests. `make test` does (`--ignored`).
#[test]
#[ignore = "installs a package on the host; `make test` runs it alone after the other tests"]
fn debian_package_installs_runs_every_example_and_purges_cleanly() {
    ensure_user(ALICE);
    let guard = HostGuard::claim();

    // --- build: the same script `make deb` runs, from the debug binaries.
    let bindir = Path::new(PTRAIND).parent().unwrap();
    assert_eq!(Path::new(PTRAIN).parent().unwrap(), bindir);
    let out_dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("package-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_dir);
    let built = Command::new("bash")
        .arg(repo_root().join("packaging/build-deb.sh"))
        .arg(bindir)
        .arg(&out_dir)
        // Fast to build and to unpack; `make deb` uses xz.
        .env("DEB_COMPRESSION", "gzip")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let deb = succeed(built, "packaging/build-deb.sh").trim().to_owned();
    assert!(deb.ends_with(".deb") && Path::new(&deb).is_file(), "{deb}");
    lintian_clean(&deb);

    let field = |name: &str| {
        let out = Command::new("dpkg-deb")
            .args(["-f", &deb, name])
            .output()
            .unwrap();
        succeed(out, "dpkg-deb -f").trim().to_owned()
    };
    assert_eq!(field("Package"), "ptrain");
    assert_eq!(field("Version"), env!("CARGO_PKG_VERSION"));
    let depends = field("Depends");
    assert!(
        depends.contains("systemd")
            && depends.contains("libc6 (>=")
            && depends.contains("libsystemd0"),
        "{depends}"
    );
    let listing = succeed(
        Command::new("dpkg-deb")
            .args(["-c", &deb])
            .output()
            .unwrap(),
        "dpkg-deb -c",
    );
    for path in [
        "./usr/sbin/ptraind",
        "./usr/bin/ptrain",
        "./lib/systemd/system/ptraind.service",
        "./lib/systemd/system/ptrain.slice",
        "./lib/systemd/system/ptrain-exit@.service",
        "./usr/share/dbus-1/system.d/org.ptrain.Daemon1.conf",
        "./usr/lib/tmpfiles.d/ptrain.conf",
        "./etc/ptrain/ptrain.toml",
        "./usr/share/man/man1/ptrain.1.gz",
        "./usr/share/man/man1/ptrain-submit.1.gz",
        "./usr/share/man/man8/ptraind.8.gz",
        "./usr/share/man/man5/ptrain-job.5.gz",
        "./usr/share/man/man5/ptrain.toml.5.gz",
        "./usr/share/bash-completion/completions/ptrain",
        "./usr/share/zsh/vendor-completions/_ptrain",
        "./usr/share/fish/vendor_completions.d/ptrain.fish",
        "./usr/share/doc/ptrain/copyright",
        "./usr/share/doc/ptrain/grafana-dashboard.json",
        "./usr/share/doc/ptrain/ptrain-cloudevent.schema.json",
    ] {
        assert!(
            listing.lines().any(|l| l.ends_with(&format!(" {path}"))),
            "{path} is not in the package:\n{listing}"
        );
    }
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with("-rw------- root/root")
                && l.ends_with(" ./etc/ptrain/ptrain.toml")),
        "the config is root-only: {listing}"
    );

    // --- install into a running systemd. The harness goes before the
    // guard (declared after it): nothing runs when the guard purges.
    let harness = Harness::boot("package", 2, None, &[]);
    // policy-rc.d is the host's (in containers, "start nothing"); inside
    // the harness services are meant to run.
    if Path::new("/usr/sbin/policy-rc.d").exists() {
        succeed(
            inside(
                &harness,
                "mount",
                &["--bind", "/bin/true", "/usr/sbin/policy-rc.d"],
            ),
            "bind /bin/true over policy-rc.d in the harness",
        );
    }
    succeed(inside(&harness, "dpkg", &["-i", &deb]), "dpkg -i");
    assert_eq!(package_status(), "installed");
    let conffiles = succeed(
        inside(&harness, "dpkg-query", &["-W", "-f=${Conffiles}", "ptrain"]),
        "dpkg-query",
    );
    assert!(conffiles.contains("/etc/ptrain/ptrain.toml"), "{conffiles}");

    // postinst: directories, enabled, started with the shipped config.
    for (dir, mode) in [
        ("/var/spool/ptrain", 0o1733),
        ("/var/lib/ptrain", 0o700),
        ("/var/log/ptrain", 0o700),
    ] {
        let meta = std::fs::metadata(dir).unwrap_or_else(|e| panic!("{dir}: {e}"));
        assert_eq!(meta.permissions().mode() & 0o7777, mode, "{dir}");
    }
    assert_eq!(
        systemctl_value(&harness, "is-enabled", "ptraind.service"),
        "enabled"
    );
    assert_eq!(
        systemctl_value(&harness, "is-active", "ptraind.service"),
        "active",
        "postinst starts ptraind with the shipped config: {}",
        harness.journal(&["-u", "ptraind.service"])
    );
    let (ok, out) = harness.systemctl(&["enable", "--now", "ptraind.service"]);
    assert!(ok, "systemctl enable --now ptraind: {out}");
    let unit_path = harness
        .systemctl(&["show", "ptraind.service", "-p", "FragmentPath", "--value"])
        .1;
    assert_eq!(unit_path.trim(), "/lib/systemd/system/ptraind.service");
    let page = succeed(
        inside(&harness, "zcat", &["/usr/share/man/man8/ptraind.8.gz"]),
        "zcat",
    );
    assert!(page.contains(".TH ptraind 8"), "{page}");

    // --- the admin's configuration: the harness's two (fake) GPUs, the
    // metrics endpoint, and the channels spool-examples/notify.json names
    // (nothing listens at their ports: deliveries wait to be retried).
    let metrics_port = free_port();
    let dead_port = free_port();
    let shipped = std::fs::read_to_string("/etc/ptrain/ptrain.toml").unwrap();
    assert!(shipped.contains("backend = \"auto\""), "{shipped}");
    let mut config = shipped.replace("backend = \"auto\"", "backend = \"declared\"");
    for i in 0..2 {
        config.push_str(&format!(
            "\n[[gpus.declared]]\nindex = {i}\nuuid = \"GPU-{i:08x}-0000-4000-8000-00000000a000\"\n\
             name = \"Package test GPU\"\nmemory_mib = 16384\ndevice = \"/dev/nvidia{i}\"\n"
        ));
    }
    config.push_str(&format!(
        "\n[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n\n\
         [notify]\nowner_email = {{ {ALICE} = \"alice@example.com\" }}\n\n\
         [channels.ops-wecom]\nkind = \"wecom\"\n\
         url = \"http://127.0.0.1:{dead_port}/cgi-bin/webhook/send?key=package-test\"\n\n\
         [channels.owner-mail]\nkind = \"email\"\nsmtp_host = \"127.0.0.1\"\n\
         smtp_port = {dead_port}\ntls = \"none\"\nfrom = \"ptrain <ptrain@example.com>\"\n\
         to_owner = true\n"
    ));
    std::fs::write("/etc/ptrain/ptrain.toml", config).unwrap();
    succeed(
        inside(&harness, "/usr/sbin/ptraind", &["--check-config"]),
        "ptraind --check-config",
    );
    let (ok, out) = harness.systemctl(&["restart", "ptraind.service"]);
    assert!(
        ok,
        "restart: {out}\n{}",
        harness.journal(&["-u", "ptraind.service"])
    );

    // --- every example, submitted by a user with the installed CLI, and
    // one broken file dropped by hand.
    let work = PathBuf::from(format!("/srv/ptrain-tests/package-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    std::fs::set_permissions("/srv/ptrain-tests", std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o755)).unwrap();
    let examples = examples();
    assert!(examples.len() >= 8, "{examples:?}");
    for (path, id, _) in &examples {
        let copy = work.join(format!("{id}.json"));
        std::fs::copy(path, &copy).unwrap();
        chown(&copy, ALICE);
        let out = inside(
            &harness,
            "runuser",
            &[
                "-u",
                ALICE,
                "--",
                "/usr/bin/ptrain",
                "submit",
                copy.to_str().unwrap(),
            ],
        );
        succeed(out, &format!("ptrain submit {}", path.display()));
    }
    let broken = work.join("broken.json");
    std::fs::write(&broken, "{\"version\": 1}").unwrap();
    chown(&broken, ALICE);
    succeed(
        inside(
            &harness,
            "runuser",
            &[
                "-u",
                ALICE,
                "--",
                "cp",
                broken.to_str().unwrap(),
                "/var/spool/ptrain/broken.json",
            ],
        ),
        "cp broken.json into the spool",
    );

    let list = || -> Vec<Value> {
        let out = succeed(
            inside(&harness, "/usr/bin/ptrain", &["list", "--json"]),
            "ptrain list",
        );
        serde_json::from_str(&out).expect("ptrain list --json is JSON")
    };
    let jobs = wait_for("every example job to end", WAIT, || {
        let jobs = list();
        let ids: BTreeSet<&str> = jobs.iter().filter_map(|j| j["id"].as_str()).collect();
        let all_known = examples.iter().all(|(_, id, spec)| {
            ids.contains(id.as_str())
                || (spec.get("sweep").is_some()
                    && jobs
                        .iter()
                        .any(|j| j["group"].as_str() == Some(id.as_str())))
        });
        let all_ended = jobs
            .iter()
            .all(|j| !ptrain::job::Outcome::is_active(j["status"].as_str().unwrap_or("")));
        (all_known && all_ended).then_some(jobs)
    });
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    for j in &jobs {
        let status = j["status"].as_str().unwrap().to_owned();
        // pipeline/4-alert.json runs only if a stage fails: it never does.
        assert!(
            status == "succeeded" || (status == "not-needed" && j["id"] == "pipe-alert"),
            "{}: {status}: {j}\n{}",
            j["id"],
            harness.journal(&["-u", "ptraind.service"])
        );
        *by_status.entry(status).or_default() += 1;
    }
    let succeeded = by_status["succeeded"];
    wait_for("broken.json to be rejected", WAIT, || {
        let out = inside(&harness, "/usr/bin/ptrain", &["rejected", "--json"]);
        succeed(out, "ptrain rejected")
            .contains("broken.json")
            .then_some(())
    });

    // --- the Prometheus endpoint, from the host (the harness shares its
    // network).
    let s = wait_for(
        "the metrics to show every job and the backlog",
        WAIT,
        || {
            let (code, body) = http_get(metrics_port, "/metrics").ok()?;
            assert_eq!(code, 200, "{body}");
            let s = samples(&body);
            let backlog = s
                .get("ptrain_notifications{state=\"pending\"}")
                .copied()
                .unwrap_or(0.0)
                + s.get("ptrain_notifications{state=\"retrying\"}")
                    .copied()
                    .unwrap_or(0.0);
            let done = s.get("ptrain_job_run_duration_seconds_count") == Some(&(succeeded as f64));
            (done && backlog >= 1.0).then_some(s)
        },
    );
    assert_eq!(metric(&s, "ptrain_jobs{status=\"queued\"}"), 0.0);
    assert_eq!(metric(&s, "ptrain_jobs{status=\"running\"}"), 0.0);
    assert_eq!(
        metric(&s, "ptrain_jobs_finished_total{status=\"not-needed\"}"),
        1.0
    );
    assert_eq!(
        metric(&s, "ptrain_jobs_finished_total{status=\"succeeded\"}"),
        succeeded as f64
    );
    // Every job that succeeded was launched once, after waiting in the queue.
    assert_eq!(
        metric(&s, "ptrain_job_queue_wait_seconds_count"),
        succeeded as f64
    );
    assert_eq!(
        metric(&s, "ptrain_job_queue_wait_seconds_bucket{le=\"+Inf\"}"),
        succeeded as f64
    );
    // The same ends, per user: every one is some user's.
    let per_user_succeeded: f64 = s
        .iter()
        .filter(|(k, _)| {
            k.starts_with("ptrain_user_jobs_finished_total{") && k.contains("status=\"succeeded\"")
        })
        .map(|(_, v)| *v)
        .sum();
    assert_eq!(per_user_succeeded, succeeded as f64);
    assert_eq!(metric(&s, "ptrain_rejected_files_total"), 1.0);
    assert_eq!(metric(&s, "ptrain_gpus{backend=\"declared\"}"), 2.0);
    assert_eq!(metric(&s, "ptrain_gpus_allocated"), 0.0);
    assert_eq!(
        metric(
            &s,
            "ptrain_gpu_memory_total_bytes{gpu=\"1\",uuid=\"GPU-00000001-0000-4000-8000-00000000a000\"}"
        ),
        16384.0 * 1048576.0
    );
    assert_eq!(metric(&s, "ptrain_scrape_source_up{source=\"gpus\"}"), 1.0);
    assert_eq!(
        metric(&s, "ptrain_scrape_source_up{source=\"notifications\"}"),
        1.0
    );
    let (code, _) = http_get(metrics_port, "/nothing").unwrap();
    assert_eq!(code, 404);

    // --- remove: stopped, files gone, configuration and data kept.
    succeed(inside(&harness, "dpkg", &["-r", "ptrain"]), "dpkg -r");
    assert_eq!(package_status(), "config-files");
    assert_ne!(
        systemctl_value(&harness, "is-active", "ptraind.service"),
        "active"
    );
    for gone in [
        "/usr/sbin/ptraind",
        "/usr/bin/ptrain",
        "/lib/systemd/system/ptraind.service",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} is left after dpkg -r");
    }
    assert!(
        Path::new("/etc/ptrain/ptrain.toml").exists(),
        "remove keeps the config"
    );
    assert!(
        std::fs::read_dir("/var/lib/ptrain")
            .unwrap()
            .next()
            .is_some(),
        "remove keeps the job records"
    );
    assert!(
        http_get(metrics_port, "/metrics").is_err(),
        "ptraind still answers"
    );

    // --- purge: nothing of ptrain is left.
    succeed(
        inside(&harness, "dpkg", &["--purge", "ptrain"]),
        "dpkg --purge",
    );
    let status = package_status();
    assert!(status.is_empty() || status == "not-installed", "{status}");
    for dir in DATA_DIRS {
        assert!(!Path::new(dir).exists(), "{dir} is left after the purge");
    }
    for link in [
        "/etc/systemd/system/multi-user.target.wants/ptraind.service",
        "/etc/systemd/system/ptraind.service",
        "/var/lib/systemd/deb-systemd-helper-enabled/ptraind.service.dsh-also",
        "/var/lib/systemd/deb-systemd-helper-masked/ptraind.service",
    ] {
        assert!(
            std::fs::symlink_metadata(link).is_err(),
            "{link} is left after the purge"
        );
    }

    // The host as it was: what was there before is again, nothing else.
    let before: Vec<&str> = guard.existing.iter().map(|e| e.path).collect();
    drop(harness);
    drop(guard);
    for dir in DATA_DIRS {
        assert_eq!(Path::new(dir).is_dir(), before.contains(&dir), "{dir}");
    }
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&out_dir);
}
