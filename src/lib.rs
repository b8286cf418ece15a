//! ptrain: run GPU training jobs unattended as supervised systemd units.
//!
//! # Layout
//!
//! The modules follow a job's path through the daemon:
//!
//! 1. [`spool`]: a user drops `NAME.json` into the spool directory. The
//!    watcher (inotify, through `notify`) reports close-write and moved-to
//!    events (a name that is not UTF-8 is first renamed to one showing its
//!    bytes, [`spool::entry_name`]); [`spool::read_spool_file`] opens the
//!    file relative to the spool's fd without following links and decides
//!    everything from `fstat` of the open fd (owner, type, link count, size).
//! 2. [`spec`]: the bytes are parsed into a validated [`spec::JobSpec`]
//!    (strict, bounded, versioned). The descriptor owns its fields' types
//!    and parsers ([`spec::notify`], [`spec::dependencies`], the
//!    `idle_timeout` check). Pure: no I/O.
//! 3. [`store`]: the job is claimed durably into the root-only state
//!    directory (one file per job, its record and the submitted bytes,
//!    written whole through the directory's one spare and fsynced,
//!    [`fsutil::SpareDir`]) before the spool file is removed; rejected
//!    files go to quarantine with their reason. A job that names an
//!    `image` is `pulling` until [`images`] has it on disk (pulled or
//!    imported as its owner off the state task, verified, unpacked once,
//!    its own root cloned from the shared tree: `daemon/images.rs`); it is
//!    not planned until then.
//! 4. [`scheduler`]: the pure core that decides which queued jobs start now,
//!    choosing GPUs from an inventory snapshot ([`gpu`]) by priority, with
//!    reservations against starvation, within the `[policy]` ([`policy`]);
//!    with `[policy] fair_share`, jobs of equal priority go by their
//!    owners' recent GPU use ([`fair_share`], Slurm's classic formula);
//!    the GPU jobs of a user over their `gpu_hours` quota wait ([`quota`]).
//! 5. [`unit`](mod@unit): the transient unit's properties (identity, confinement, GPU
//!    device allow-list, the daemon's variables) are built from the record.
//!    Pure. Nothing the user wrote is a property but the workdir: the
//!    command, its environment and its secrets go to the job's launch file
//!    ([`runtime`]), which `ptraind exec-job` reads as the job's user and
//!    execs; the job's result directory is made there too. An image job's
//!    unit runs in its image's root (`RootDirectory=`, the same baseline),
//!    `exec-job` through the host's loader bound in
//!    ([`runtime::HostExec`]), its GPUs as the host's CDI specs give them
//!    ([`cdi`]).
//! 6. [`systemd`]: `StartTransientUnit` over D-Bus (from a task of its own
//!    per launch: the state task never waits on it), and one stream of
//!    `JobRemoved` / `PropertiesChanged` signals, from systemd's own bus
//!    name only, that tells when a unit ends; the end (Result, exit code or
//!    signal) comes in the signals themselves (or is read back when they
//!    fall short) before the unit is released for garbage collection. A
//!    job that ends while ptraind is down is recorded by its unit's
//!    `OnSuccess=`/`OnFailure=` recorder (`ptrain-exit@.service`, `ptraind
//!    record-exit`) from the facts systemd hands it. What the end means is
//!    [`job`]'s: its state and [`job::Outcome`] (from the unit's end,
//!    [`job::outcome_of_unit`], relabelled by the idle watchdog,
//!    [`job::idle_outcome`]), the outcome's status word and sentence, and
//!    the notification event it raises. Pure. An ended unit stays
//!    loaded a while for `systemctl status` ([`kept_units`], pure: which to
//!    release when).
//! 7. [`daemon`]: the one task that owns the state, receives every event
//!    (spool, systemd, API) on a channel and applies it. Whether a claimed
//!    file becomes jobs is its admission room (`daemon/admission.rs`,
//!    pure: the rules in refusal order over what the daemon knows, behind
//!    a trait; the passwd lookup, the workdir check as the owner and the
//!    claim's writes stay in the state task). The unended jobs and the
//!    indices over them (queue, per-user counts, GPU holders) are its
//!    `Live` room (`daemon/live.rs`, pure), changed only by one method
//!    per step of a job's life. What a plan decides (which jobs start, in
//!    what order, within the units systemd can track; which can never
//!    start) is its planning room (`daemon/planning.rs`, pure, over `Live`
//!    and a look at the GPUs handed in as a function), and what a launch,
//!    a running unit and an end write into a job's record, with the
//!    notifications each raises, its lifecycle room (`daemon/lifecycle.rs`,
//!    pure); the state task reads the facts (systemd, the job's files,
//!    the clock) and saves, sends and launches. What callers read without waiting for the
//!    state task is on the [`board`]: each live job's view as last posted,
//!    and the newest ends' summaries (an older end is read from its
//!    record). [`api`] is the
//!    D-Bus object the `ptrain` CLI talks to (and its proxy); it asks the
//!    state task through [`requests`] (each request carries its reply
//!    channel; [`requests::ApiError`]) and answers with [`views`], the
//!    JSON shapes `--json` prints (pure).
//! 8. [`notifications`]: a job's submission, start and end are announced
//!    to the admin's channels (email, WeCom robot, webhook; every job's
//!    events to an AMQP or Kafka stream, in order per job) from an outbox written
//!    with the state change, by a sender task that retries and never holds
//!    up the state task. Events of no job go to the streams too: a refused
//!    file's (its outbox record is its quarantine entry) and a GPU leaving
//!    or rejoining the pool ([`gpu_health`], the health last told, kept
//!    across restarts).
//! 9. [`logs`]: a job's output, read from the journal (in-process through
//!    libsystemd, [`logs::sd_journal`], or `journalctl --follow` for a live
//!    reader) or its archive, and served to its owner; the idle-output
//!    watchdog; per-job archives and their retention.
//! 10. [`history`]: once ended, a job leaves the daemon's live map; its
//!     record stays on disk, the order of the ends in `STATE/end-order`
//!     (rebuilt at each start), and only the newest ends' summaries in
//!     memory ([`history::Recent`]), so memory and per-job cost stay flat
//!     over a long history; `[retention]` compacts the oldest into
//!     `STATE/history.jsonl`.
//! 11. [`accounting`]: what each run used (its cgroup's counters, read at
//!     the command's end by the watcher `exec-job` forked, as the job's
//!     user, and kept in the end record; GPU-seconds from its times and GPUs; utilization and memory
//!     per GPU from NVML samples the state task adds to the running
//!     record, [`accounting::gpu`]), one row per ended run in
//!     `STATE/accounting.sqlite`, committed in groups by a task of its own
//!     and back-filled from the records at start; `ptrain history` and
//!     `ptrain report` query it through that task, so that every run ended
//!     before a query is in its answer ([`accounting::query`] builds the SQL, pure;
//!     [`accounting::db`] is SQLite, which runs only in ptraind's
//!     children, [`accounting::helper`]: one per query, and one stream
//!     kept while ends keep coming). `[accounting] enabled = false` turns
//!     all of it off.
//!
//! [`config`] loads and validates `/etc/ptrain/ptrain.toml` (each section
//! checks its own values and answers a [`setting::InvalidSetting`]: the
//! dotted key and the fix); [`fsutil`] holds
//! the durable-write and safe-open primitives; [`users`] resolves uids;
//! [`metrics`] is the optional Prometheus endpoint the state task feeds;
//! [`docgen`] writes the man pages and shell completions (`make docs`);
//! [`display`] escapes user-controlled text for human-readable output;
//! [`notify_socket`] sends the status line and watchdog pings to systemd from
//! a thread of its own (a full notify socket blocks the sender).
//! [`cdi`] reads the host's CDI specs (`/etc/cdi`, `/var/run/cdi`, root's
//! alone) and turns a job's GPUs into what its unit in a container image
//! needs (device allow-list, read-only binds, variables, the symlinks and
//! library folders of nvidia's hooks, which are never run); mixed: only
//! [`cdi::load`] does I/O.
//! [`slurm`] is the start of the Slurm backend (issue 24): the pure room
//! that turns a job, or a sweep as one job array, into an `sbatch`
//! submission with Slurm's meanings kept and the fields Slurm cannot
//! honour refused by name ([`slurm::prepare`]); `tests/integration/slurm.rs`
//! runs what it builds on the tests' multi-node cluster
//! (`tests/harness/slurm/`). ptraind does not use it yet.
//!
//! # Floors
//!
//! The pure core takes values (and `now`) and does no I/O: [`spec`],
//! [`job`], [`chain`], [`scheduler`], [`policy`], [`resources`],
//! [`kept_units`], [`unit`](mod@unit), [`views`] and [`setting`]. `tests/module_graph.rs` checks
//! that none of them names an I/O module or an I/O item of a mixed one, and
//! that no import cycle appears beyond the ones it lists.
//!
//! Mixed floors keep pure values beside their I/O, and the core imports
//! only the values: [`store`] (the record and its outbox intents; `Store`
//! reads and writes the state directory), [`gpu`] (the snapshot and the
//! choice of GPUs; NVML), [`runtime`] (the launch file; preparing it writes
//! files), [`users`] (`Owner`; the passwd and group lookups), [`config`]
//! (the validated settings; loading the file), [`notifications`]
//! (render, retry and pacing are pure; the sender, transports, outbox and
//! output tail are not), [`images`] (references, manifests, a job's argv
//! and environment from its image, the collection plan and the
//! `[images]` settings are pure;
//! pulling, importing, unpacking and the store are not) and
//! [`accounting`] (the rows, the queries' SQL and
//! the cgroup parsers are pure; the database, its child process and the
//! cgroup reader are not).
//!
//! The rest is I/O: [`daemon`] (but for its admission and live rooms),
//! [`board`] (it reads an ended job's record from disk), [`systemd`],
//! [`api`], [`requests`] (the channel to the state task), [`spool`],
//! [`logs`], [`metrics`], [`fsutil`], [`memory`] (the heap's trim), and
//! [`history`] (the end order's file; the recent ends' summaries).
//!
//! No import cycle is left, and `tests/module_graph.rs` keeps it so. The
//! service wings import downwards only: [`api`] imports [`requests`],
//! [`views`], [`logs`] and [`notifications`]; [`requests`] names
//! [`notifications`]' reply types; [`notifications`] reads [`logs`]'
//! journal for a job's last lines; [`logs`] imports only [`views`] of
//! them (a follower that fell behind asks where its job stands through a
//! [`logs::JobLookup`] the D-Bus face hands in). Each wing answers with its
//! own error ([`logs::LogsError`], [`notifications::DeliveriesError`]),
//! which [`api`] turns into a D-Bus error, and owns its settings section
//! ([`logs::LogsConfig`], [`views::Privacy`], ...), which [`config`]
//! loads; [`logs`] takes only its own ([`logs::LogSettings`]).

pub mod accounting;
pub mod api;
pub mod board;
pub mod cdi;
pub mod chain;
pub mod config;
pub mod daemon;
pub mod display;
pub mod docgen;
pub mod fair_share;
pub mod fsutil;
pub mod gpu;
pub mod gpu_health;
pub mod history;
pub mod images;
pub mod job;
pub mod kept_units;
pub mod logs;
pub mod memory;
pub mod metrics;
pub mod notifications;
pub mod notify_socket;
pub mod policy;
pub mod preemption;
pub mod quota;
pub mod requests;
pub mod resources;
pub mod runtime;
pub mod scheduler;
pub mod setting;
pub mod slurm;
pub mod spec;
pub mod spool;
pub mod store;
pub mod systemd;
pub mod unit;
pub mod users;
pub mod views;

/// The well-known bus name, object path and interface of ptraind's API.
pub const DBUS_NAME: &str = "org.ptrain.Daemon1";
pub const DBUS_PATH: &str = "/org/ptrain/Daemon1";

/// Microseconds since the Unix epoch, the one time unit of records and of
/// systemd's timestamps.
pub fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
