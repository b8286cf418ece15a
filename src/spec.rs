//! The job descriptor (spec version 1): the JSON file a user drops into the
//! spool directory.
//!
//! The input is hostile — any local user can write it and the daemon runs as
//! root — so parsing is done in stages that each bound the work of the next:
//! size limit, UTF-8 check, a byte pre-scan for NUL and nesting depth, a
//! strict JSON parse that rejects duplicate keys and NUL characters, and only
//! then field-by-field validation with messages aimed at the person who wrote
//! the file.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

pub mod begin;
pub mod checkpoint;
pub mod dependencies;
mod gpu_request;
mod idle_timeout;
pub mod notify;
pub mod retry;
pub use gpu_request::{GpuRequest, GpuSelector, GPUS_FIELDS, MAX_GPU_INDEX};
pub use idle_timeout::{validate_idle_timeout, MAX_IDLE_TIMEOUT};

/// The descriptor format version this daemon understands.
pub const SPEC_VERSION: u64 = 1;
/// Largest accepted descriptor; readers read at most this + 1 bytes so that an
/// oversized file is detected without reading all of it.
pub const MAX_SPEC_BYTES: usize = 64 * 1024;
/// Deepest accepted nesting of arrays/objects. A descriptor needs 3
/// (`"gpus": {"indices": [..]}`); the margin leaves room for later versions
/// while keeping recursion trivially bounded.
pub const MAX_JSON_DEPTH: usize = 32;
/// Most arguments accepted in `command`.
pub const MAX_ARGV: usize = 4096;
/// Most variables accepted in `env`.
pub const MAX_ENV: usize = 1024;
/// Most secrets accepted in `credentials`.
pub const MAX_CREDENTIALS: usize = 32;
/// Most GPUs one job may request.
pub const MAX_GPUS: u32 = 64;
/// Range of `priority`: higher runs first, 0 when absent.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i64> = -100..=100;
/// Longest accepted `timeout`.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// Longest accepted job id (and spool file stem).
pub const MAX_ID_LEN: usize = 64;
/// Longest accepted `user` (LOGIN_NAME_MAX less the terminating NUL).
pub const MAX_USER_LEN: usize = 255;
/// Longest accepted `name`, in characters: a title that fits a table row.
pub const MAX_NAME_CHARS: usize = 128;
/// Longest accepted `comment`, in characters: a sentence or two, not a log.
pub const MAX_COMMENT_CHARS: usize = 1024;

/// Every top-level field version 1 accepts, in documentation order. This list is
/// the single source of truth for unknown-field detection and its message.
pub const SPEC_FIELDS: &[&str] = &[
    "version",
    "id",
    "name",
    "comment",
    "command",
    "workdir",
    "env",
    "credentials",
    "gpus",
    "timeout",
    "idle_timeout",
    "user",
    "priority",
    "resources",
    "after_ok",
    "after_fail",
    "after_any",
    "sweep",
    "max_parallel",
    "notify",
    "notify_on",
    "hold",
    "begin",
    "retries",
    "retry_on",
    "retry_delay",
    "requeue_exit_code",
    "checkpoint_signal",
    "checkpoint_lead",
    "stop_grace",
    "preemptible",
    "image",
];

/// Environment variables a job may not set, with why. Matching is exact
/// (variable names are case-sensitive); `PTRAIN_*` is handled separately.
const RESERVED_ENV: &[(&str, &str)] = &[
    (
        "CUDA_VISIBLE_DEVICES",
        "ptraind assigns GPUs through it (ask for GPUs with field `gpus`)",
    ),
    (
        "CUDA_DEVICE_ORDER",
        "ptraind fixes the device order so GPU numbers match its allocation",
    ),
    (
        "NVIDIA_VISIBLE_DEVICES",
        "ptraind assigns GPUs itself (ask for GPUs with field `gpus`)",
    ),
    (
        "LD_PRELOAD",
        "injecting libraries into jobs is not allowed (link or load the library from your program)",
    ),
    ("LD_AUDIT", "loader audit modules are not allowed"),
    (
        "CREDENTIALS_DIRECTORY",
        "it names the directory of the job's secrets (field `credentials`)",
    ),
    ("USER", "it is set from the account that owns the job file"),
    (
        "LOGNAME",
        "it is set from the account that owns the job file",
    ),
];

/// Longest excerpt of user-supplied text quoted in an error message, so a
/// hostile file cannot flood the log through its own error.
const QUOTE_MAX: usize = 80;
/// Longest quoted excerpt, escapes included.
const QUOTE_MAX_BYTES: usize = 2 * QUOTE_MAX;
/// Longest rendered location (`a.b[2].c`) in an error message: a hostile
/// file can nest 32 long keys deep.
const PATH_MAX_BYTES: usize = 200;

/// A validated job id: `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`, so it is safe as a
/// file name and as a systemd unit instance without escaping.
///
/// Shared, not owned: the live table, the history's map and its end-time
/// index, and every message about a job hold the same id, and a long
/// history keeps one copy of each.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct JobId(std::sync::Arc<str>);

/// Prefix of every job unit's name (`ptrain-job@ID.service`).
pub const JOB_UNIT_PREFIX: &str = "ptrain-job@";
/// The exit recorder's template, `units/ptrain-exit@.service`.
pub const RECORDER_PREFIX: &str = "ptrain-exit@";
const RECORDER_KINDS: [&str; 2] = ["ok", "failed"];
const UNIT_SUFFIX: &str = ".service";

impl JobId {
    /// Validates `s` as a job id.
    pub fn parse(s: &str) -> Result<JobId, SpecError> {
        if is_valid_id(s) {
            Ok(JobId(s.into()))
        } else {
            Err(SpecError::InvalidId { id: quote(s) })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The same id in an allocation of its own, not shared with this one:
    /// for what outlives the value it came from (a summary kept long after
    /// its record was parsed and dropped), so that it does not keep that
    /// value's heap pages resident.
    pub fn own_copy(&self) -> JobId {
        JobId(self.as_str().into())
    }

    /// The transient unit that runs this job: `ptrain-job@<id>.service`.
    pub fn unit_name(&self) -> String {
        format!("{JOB_UNIT_PREFIX}{}{UNIT_SUFFIX}", self.0)
    }

    /// Inverse of [`JobId::unit_name`]; `None` for any other unit.
    pub fn from_unit_name(unit: &str) -> Option<JobId> {
        let id = unit
            .strip_prefix(JOB_UNIT_PREFIX)?
            .strip_suffix(UNIT_SUFFIX)?;
        JobId::parse(id).ok()
    }

    /// The units that record how this job's unit ended, its OnSuccess= and
    /// OnFailure= (`ptrain-exit@.service`): two instances, because systemd
    /// hands the end ($MONITOR_*) only to a unit with exactly one trigger.
    pub fn recorder_units(&self) -> [String; 2] {
        RECORDER_KINDS.map(|kind| format!("{RECORDER_PREFIX}{kind}-{}{UNIT_SUFFIX}", self.0))
    }

    /// Inverse of [`JobId::recorder_units`]; `None` for any other unit.
    pub fn from_recorder_unit(unit: &str) -> Option<JobId> {
        let instance = unit
            .strip_prefix(RECORDER_PREFIX)?
            .strip_suffix(UNIT_SUFFIX)?;
        let id = RECORDER_KINDS
            .iter()
            .find_map(|kind| instance.strip_prefix(kind)?.strip_prefix('-'))?;
        JobId::parse(id).ok()
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for JobId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for JobId {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobId::parse(s)
    }
}

impl TryFrom<String> for JobId {
    type Error = SpecError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        if is_valid_id(&s) {
            Ok(JobId(s.into()))
        } else {
            Err(SpecError::InvalidId { id: quote(&s) })
        }
    }
}

impl From<JobId> for String {
    fn from(id: JobId) -> String {
        id.0.to_string()
    }
}

fn is_valid_id(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_ID_LEN
        && b[0].is_ascii_alphanumeric()
        && b[1..]
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// The spool file name rule: `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\.json$`.
/// Returns the stem, which is the job's default id. Dotfiles, temp names and
/// editor leftovers (`.x.json.swp`, `x.json~`, `#x.json#`) give `None`, so a
/// half-written file is never picked up.
pub fn spool_file_stem(file_name: &str) -> Option<&str> {
    let stem = file_name.strip_suffix(".json")?;
    is_valid_id(stem).then_some(stem)
}

/// A validated job descriptor. The serde form is for the daemon's own state
/// store (user input goes through [`parse_spec`]); optional fields default so
/// records written before a field existed still load.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobSpec {
    pub id: JobId,
    /// argv; non-empty, `argv[0]` non-empty, no NUL anywhere.
    pub command: Vec<String>,
    /// Absolute and normalised (no `.`/`..` components, no repeated `/`).
    #[serde(default)]
    pub workdir: Option<PathBuf>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A bare count in records written before the object form existed;
    /// both forms load.
    #[serde(default)]
    pub gpus: GpuRequest,
    /// Stored as a humantime string ("12h") so the state file stays readable;
    /// integer seconds are accepted on the way back in.
    #[serde(default, with = "timeout_serde")]
    pub timeout: Option<Duration>,
    /// Stop the job when it writes no output for this long ([`crate::logs`]).
    #[serde(
        default,
        with = "timeout_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub idle_timeout: Option<Duration>,
    /// If present the daemon checks it equals the file owner's name.
    #[serde(default)]
    pub user: Option<String>,
    /// A title for people (`ptrain status`, `list --json`); one line of
    /// plain text, at most [`MAX_NAME_CHARS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A note for people; one line of plain text, at most
    /// [`MAX_COMMENT_CHARS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// Queue order: higher first, then arrival. Within [`PRIORITY_RANGE`].
    #[serde(default)]
    pub priority: i32,
    /// Memory, CPU and task limits the job asks for (within its owner's caps).
    #[serde(default)]
    pub resources: crate::resources::ResourceRequest,
    /// Jobs (or sweeps) this one waits for.
    #[serde(default, flatten)]
    pub after: dependencies::Dependencies,
    /// Present only in a descriptor; the stored members have it expanded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<dependencies::Sweep>,
    /// Channels to notify (admin-configured names); `None`: the admin's
    /// default channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<Vec<String>>,
    /// Events to notify about; `None`: every end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_on: Option<Vec<crate::job::NotifyEvent>>,
    /// Secrets by name: files the owner names, read as the owner when the
    /// job starts and handed to it as systemd credentials (files in
    /// `$CREDENTIALS_DIRECTORY`), never through the environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub credentials: BTreeMap<String, PathBuf>,
    /// Submitted held: queued, holding nothing, until its owner (or root)
    /// releases it (`ptrain release`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold: bool,
    /// Not before this moment, or this long after the file was written
    /// ([`begin`]); the record keeps the moment it resolved to.
    #[serde(
        default,
        with = "begin::serde_form",
        skip_serializing_if = "Option::is_none"
    )]
    pub begin: Option<begin::Begin>,
    /// Whether a failed attempt runs again ([`retry`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<retry::Retry>,
    /// A signal sent that long before the job's timeout and before any
    /// stop ptraind makes ([`checkpoint`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<checkpoint::Checkpoint>,
    /// The container image the job runs in (issue 21), normalized
    /// ([`crate::images::ImageSource`]'s form); `None`: the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// SIGTERM to SIGKILL for this job; `None`: `[jobs] stop_grace`.
    #[serde(
        default,
        with = "timeout_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub stop_grace: Option<Duration>,
    /// With the host's `[policy] preempt`, a queued job of higher priority
    /// that cannot start may stop this one, which runs again as its next
    /// attempt ([`crate::preemption`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preemptible: bool,
}

mod timeout_serde {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(d) => s.collect_str(&humantime::format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Secs(u64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        match Option::<Repr>::deserialize(d)? {
            None => Ok(None),
            Some(Repr::Secs(n)) => Ok(Some(Duration::from_secs(n))),
            Some(Repr::Text(t)) => humantime::parse_duration(&t)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Why a descriptor was rejected. Messages are shown to the user who wrote the
/// file: each names the field and ends with how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("field `image`: {0}")]
    Image(String),

    #[error("job file is larger than {MAX_SPEC_BYTES} bytes; a descriptor only names a command, keep data in files it reads")]
    TooLarge,

    #[error("job file is empty; write a JSON object such as {{\"version\": 1, \"command\": [\"python3\", \"train.py\"]}}")]
    Empty,

    #[error("job file is not valid UTF-8 (first bad byte at offset {offset}); save it as UTF-8")]
    InvalidUtf8 { offset: usize },

    #[error(
        "job file contains a NUL byte at offset {offset}; JSON text cannot contain NUL, remove it"
    )]
    NulByte { offset: usize },

    #[error("job file nests arrays/objects deeper than {MAX_JSON_DEPTH} levels (at byte offset {offset}); a descriptor needs at most 3, flatten it")]
    TooDeep { offset: usize },

    #[error("job file ends before the JSON is complete (line {line} column {column}); add the missing closing bracket or quote, and write the file elsewhere then rename it into the spool")]
    Truncated { line: usize, column: usize },

    #[error("job file is not valid JSON: {message} at line {line} column {column}; fix the syntax (`python3 -m json.tool FILE` points at the spot)")]
    Syntax {
        message: String,
        line: usize,
        column: usize,
    },

    #[error("duplicate key {key} in {location} (line {line} column {column}); each key may appear only once in an object, remove the extra one")]
    DuplicateKey {
        key: String,
        location: String,
        line: usize,
        column: usize,
    },

    #[error("string in {location} contains a NUL character (\\u0000); programs cannot receive NUL, remove it")]
    NulInString { location: String },

    #[error("job file must hold a JSON object at the top level, not {found}; wrap the fields in {{ ... }}")]
    NotAnObject { found: &'static str },

    #[error("field `version` is missing; add \"version\": 1")]
    MissingVersion,

    #[error("field `version` must be the integer 1, not {found}; write \"version\": 1")]
    BadVersion { found: String },

    #[error("unsupported version {version}; this ptraind reads version {SPEC_VERSION} (upgrade ptraind or write the file for version {SPEC_VERSION})")]
    UnsupportedVersion { version: u64 },

    #[error("unknown field {field}; version {SPEC_VERSION} accepts {accepted}; check the spelling or remove it")]
    UnknownField { field: String, accepted: String },

    #[error("invalid job id {id} (field `id`, defaulting to the file name without `.json`): an id is 1 to {MAX_ID_LEN} characters of A-Z a-z 0-9 . _ - starting with a letter or digit; rename the file or set a valid `id`")]
    InvalidId { id: String },

    #[error("field `{field}` must be {expected}, not {found}; {hint}")]
    WrongType {
        field: String,
        expected: &'static str,
        found: &'static str,
        hint: &'static str,
    },

    #[error("field `command` must be an array of strings (argv), not a shell string; write [\"sh\", \"-c\", \"...\"] if you need a shell")]
    CommandIsString,

    #[error("field `command` is empty; give at least the program to run, e.g. [\"python3\", \"train.py\"]")]
    CommandEmpty,

    #[error("field `command` has {len} arguments, more than the limit of {MAX_ARGV}; pass long argument lists through a file")]
    CommandTooLong { len: usize },

    #[error(
        "field `command[0]` (the program) is an empty string; name the program, e.g. \"python3\""
    )]
    CommandProgramEmpty,

    #[error("field `workdir` must be an absolute path, not {path}; start it with `/`, e.g. \"/home/alice/proj\"")]
    WorkdirNotAbsolute { path: String },

    #[error("field `workdir` must not contain `..` components ({path}); write the resolved absolute path")]
    WorkdirDotDot { path: String },

    #[error("field `workdir` {path} holds `{found}`, which systemd would read as its own syntax in a unit (`%` specifiers, `$` variables, `\\` escapes, quotes, control characters); use a directory without it")]
    WorkdirUnitSyntax { path: String, found: String },

    #[error("field `workdir` {path} is under {hidden}, of which every job gets a private, empty copy (its files would not be there); use a directory outside {hidden}")]
    WorkdirPrivate { path: String, hidden: &'static str },

    #[error("field `env` has {len} variables, more than the limit of {MAX_ENV}; put bulk configuration in a file")]
    EnvTooMany { len: usize },

    #[error("field `env` has an invalid variable name {key}; names must match [A-Za-z_][A-Za-z0-9_]*, rename it")]
    EnvBadKey { key: String },

    #[error("field `env` must not set `{key}`: {why}; remove it")]
    EnvReserved { key: String, why: &'static str },
    #[error("field `credentials`: {0}")]
    Credentials(String),

    #[error("field `gpus` must be a whole number from 0 to {MAX_GPUS} or an object such as {{\"count\": 2, \"model\": \"A100\"}}, not {found}; write e.g. \"gpus\": 1")]
    GpusInvalid { found: String },

    /// The object form of `gpus`; `message` says what is wrong and the fix.
    #[error("field `{field}` {message}")]
    GpusRequest { field: String, message: String },

    #[error("field `priority` must be a whole number from -100 to 100, not {found}; write e.g. \"priority\": 10 (higher runs first, default 0)")]
    PriorityInvalid { found: String },

    #[error("field `timeout` {value} is not a duration ({reason}); write e.g. \"90m\", \"12h\", \"1h30m\" or a whole number of seconds")]
    TimeoutInvalid { value: String, reason: String },

    #[error("field `timeout` must be more than 0 and at most 365 days, not {value}; pick a duration in that range or omit the field for no limit")]
    TimeoutOutOfRange { value: String },

    /// The message says what is wrong and how to write it.
    #[error("field `idle_timeout` {0}")]
    IdleTimeout(String),

    /// The message says what is wrong and how to write it.
    #[error("field `begin` {0}")]
    Begin(String),

    /// The message names the field and says how to write it.
    #[error("{0}")]
    Retry(String),

    /// `checkpoint_signal`, `checkpoint_lead`, `stop_grace` (the message
    /// names the field and says how to write it).
    #[error("{0}")]
    Checkpoint(String),

    #[error("field `{field}` must not be empty; write a few words or omit the field")]
    TextEmpty { field: &'static str },

    #[error("field `{field}` has {len} characters, more than the limit of {max}; shorten it (longer notes belong in a file next to the job)")]
    TextTooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },

    #[error("field `{field}` holds {found} at character {at} (a control, line break or invisible character); write it as one line of plain text")]
    TextUnsafe {
        field: &'static str,
        found: String,
        at: usize,
    },

    #[error("field `user` {user} is not a valid user name; write your login name (as `id -un` prints it) or omit the field")]
    InvalidUser { user: String },

    #[error("field `resources`: {0}")]
    Resources(String),

    /// Dependency and sweep fields (the message names the field).
    #[error("{0}")]
    Chain(String),

    /// `notify` and `notify_on` (the message names the field).
    #[error("{0}")]
    Notify(String),
}

/// Debug-quotes untrusted text (escaping control characters such as `\n`) and
/// cuts it short so an error can be logged safely.
fn quote(s: &str) -> String {
    let mut cut = s.char_indices().nth(QUOTE_MAX).map_or(s.len(), |(i, _)| i);
    loop {
        // Escaping can make a character ten bytes long (`\u{202e}`), so
        // the bound is on the quoted text, not the input.
        let quoted = format!("{:?}", &s[..cut]);
        if quoted.len() <= QUOTE_MAX_BYTES {
            return if cut == s.len() {
                quoted
            } else {
                format!("{quoted}… ({} bytes)", s.len())
            };
        }
        cut /= 2;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
    }
}

/// A value for an error message: a string quoted (escaped, bounded), a
/// number as written, anything else by its kind; never raw text that a
/// terminal would act on.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => quote(s),
        Value::Number(n) => n.to_string(),
        other => kind(other).to_owned(),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Parse and validate a descriptor. `default_id` is the spool file's stem,
/// used when the descriptor has no `id`.
pub fn parse_spec(bytes: &[u8], default_id: &str) -> Result<JobSpec, SpecError> {
    let value = parse_strict_json(bytes)?;
    let Value::Object(map) = value else {
        return Err(SpecError::NotAnObject {
            found: kind(&value),
        });
    };
    // Version first: a file written for a newer daemon should be told so,
    // not confronted with "unknown field" for the fields that version added.
    check_version(map.get("version"))?;
    RawSpec::from_object(map)?.validate(default_id)
}

/// Stages 1–4: size, UTF-8, byte pre-scan, strict parse. Returns the tree.
fn parse_strict_json(bytes: &[u8]) -> Result<Value, SpecError> {
    if bytes.len() > MAX_SPEC_BYTES {
        return Err(SpecError::TooLarge);
    }
    let text = std::str::from_utf8(bytes).map_err(|e| SpecError::InvalidUtf8 {
        offset: e.valid_up_to(),
    })?;
    // Windows editors prepend a byte order mark; it carries no meaning here.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.trim_matches([' ', '\t', '\n', '\r']).is_empty() {
        return Err(SpecError::Empty);
    }
    prescan(text.as_bytes())?;

    let problem = RefCell::new(None);
    let root = PathNode {
        seg: None,
        parent: None,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let result = StrictSeed {
        path: &root,
        problem: &problem,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v));
    result.map_err(|e| json_error(e, problem.into_inner()))
}

/// One linear pass over the bytes, tracking only string/escape state and the
/// nesting depth, so pathological nesting is refused before any recursive
/// parser sees it.
fn prescan(bytes: &[u8]) -> Result<(), SpecError> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (offset, &b) in bytes.iter().enumerate() {
        if b == 0 {
            return Err(SpecError::NulByte { offset });
        }
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return Err(SpecError::TooDeep { offset });
                }
            }
            // Unbalanced closers are a syntax error the parser will report
            // with a position; here they only must not underflow.
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

fn json_error(e: serde_json::Error, problem: Option<Problem>) -> SpecError {
    let (line, column) = (e.line(), e.column());
    match problem {
        Some(Problem::Duplicate { key, location }) => SpecError::DuplicateKey {
            key,
            location,
            line,
            column,
        },
        Some(Problem::Nul { location }) => SpecError::NulInString { location },
        None if e.classify() == serde_json::error::Category::Eof => {
            SpecError::Truncated { line, column }
        }
        None => {
            // serde_json appends the position itself; we print it ourselves.
            let full = e.to_string();
            let suffix = format!(" at line {line} column {column}");
            let message = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
            SpecError::Syntax {
                message,
                line,
                column,
            }
        }
    }
}

/// What the strict visitor found wrong; serde's error type cannot carry it.
enum Problem {
    Duplicate { key: String, location: String },
    Nul { location: String },
}

#[derive(Clone, Copy)]
enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

/// Where the visitor is, as a borrowed chain, so the path is only rendered
/// (allocated) when there is an error to report.
struct PathNode<'a> {
    seg: Option<Seg<'a>>,
    parent: Option<&'a PathNode<'a>>,
}

impl PathNode<'_> {
    fn render(&self) -> String {
        let mut segs = Vec::new();
        let mut node = Some(self);
        while let Some(n) = node {
            if let Some(seg) = n.seg {
                segs.push(seg);
            }
            node = n.parent;
        }
        if segs.is_empty() {
            return "the top-level object".to_owned();
        }
        let pieces: Vec<String> = segs
            .iter()
            .rev()
            .enumerate()
            .map(|(i, seg)| match seg {
                Seg::Key(k) if i == 0 => clip(k),
                Seg::Key(k) => format!(".{}", clip(k)),
                Seg::Index(n) => format!("[{n}]"),
            })
            .collect();
        let total: usize = pieces.iter().map(String::len).sum();
        if total <= PATH_MAX_BYTES {
            return format!("`{}`", pieces.concat());
        }
        // Too long: the first step, `…`, and as many of the last steps as
        // fit (always the last one, which is where the problem is).
        let (first, rest) = pieces.split_first().expect("segs is not empty");
        let mut tail: Vec<&str> = Vec::new();
        let mut len = first.len();
        for piece in rest.iter().rev() {
            if !tail.is_empty() && len + piece.len() > PATH_MAX_BYTES {
                break;
            }
            len += piece.len();
            tail.push(piece);
        }
        tail.reverse();
        format!("`{first}…{}`", tail.concat())
    }
}

/// Like [`quote`] without the quotes, for use inside a rendered path.
fn clip(s: &str) -> String {
    let q = quote(s);
    match q.strip_prefix('"').and_then(|q| q.strip_suffix('"')) {
        Some(inner) => inner.to_owned(),
        None => q,
    }
}

/// Builds a `serde_json::Value`, refusing duplicate keys (serde_json would keep
/// the last one silently, so two readers could disagree on what a file says)
/// and NUL characters in any string (they cannot reach argv or the
/// environment). Recursion is bounded by the pre-scan.
struct StrictSeed<'a> {
    path: &'a PathNode<'a>,
    problem: &'a RefCell<Option<Problem>>,
}

impl StrictSeed<'_> {
    fn nul_error<E: de::Error>(&self, key: Option<&str>) -> E {
        let location = match key {
            Some(k) => PathNode {
                seg: Some(Seg::Key(k)),
                parent: Some(self.path),
            }
            .render(),
            None => self.path.render(),
        };
        *self.problem.borrow_mut() = Some(Problem::Nul { location });
        E::custom("NUL character in string")
    }
}

impl<'de> DeserializeSeed<'de> for StrictSeed<'_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number is not finite"))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        if v.contains('\0') {
            return Err(self.nul_error(None));
        }
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        if v.contains('\0') {
            return Err(self.nul_error(None));
        }
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        loop {
            let node = PathNode {
                seg: Some(Seg::Index(out.len())),
                parent: Some(self.path),
            };
            let seed = StrictSeed {
                path: &node,
                problem: self.problem,
            };
            match seq.next_element_seed(seed)? {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if key.contains('\0') {
                return Err(self.nul_error(Some(&key)));
            }
            if out.contains_key(&key) {
                let location = match self.path.seg {
                    None => "the top-level object".to_owned(),
                    Some(_) => format!("object {}", self.path.render()),
                };
                let err = de::Error::custom(format_args!("duplicate key {}", quote(&key)));
                *self.problem.borrow_mut() = Some(Problem::Duplicate {
                    key: quote(&key),
                    location,
                });
                return Err(err);
            }
            let node = PathNode {
                seg: Some(Seg::Key(&key)),
                parent: Some(self.path),
            };
            let value = map.next_value_seed(StrictSeed {
                path: &node,
                problem: self.problem,
            })?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

fn check_version(v: Option<&Value>) -> Result<(), SpecError> {
    match v {
        None => Err(SpecError::MissingVersion),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(SPEC_VERSION) => Ok(()),
            Some(version) => Err(SpecError::UnsupportedVersion { version }),
            None => Err(SpecError::BadVersion {
                found: n.to_string(),
            }),
        },
        Some(other) => Err(SpecError::BadVersion {
            found: match other {
                Value::String(s) => quote(s),
                other => kind(other).to_owned(),
            },
        }),
    }
}

/// The descriptor as written, before validation: one slot per field any
/// version knows. A later version adds its fields here and to [`SPEC_FIELDS`],
/// and gates them on the version number. Values stay untyped so each field
/// gets its own precise error (and so `gpus` can later also accept an object).
/// `null` is treated as absent, which is what JSON writers mean by `None`.
#[derive(Default)]
struct RawSpec {
    id: Option<Value>,
    name: Option<Value>,
    comment: Option<Value>,
    command: Option<Value>,
    workdir: Option<Value>,
    env: Option<Value>,
    credentials: Option<Value>,
    gpus: Option<Value>,
    timeout: Option<Value>,
    idle_timeout: Option<Value>,
    user: Option<Value>,
    priority: Option<Value>,
    resources: Option<Value>,
    after_ok: Option<Value>,
    after_fail: Option<Value>,
    after_any: Option<Value>,
    sweep: Option<Value>,
    max_parallel: Option<Value>,
    notify: Option<Value>,
    notify_on: Option<Value>,
    hold: Option<Value>,
    begin: Option<Value>,
    retries: Option<Value>,
    retry_on: Option<Value>,
    retry_delay: Option<Value>,
    requeue_exit_code: Option<Value>,
    checkpoint_signal: Option<Value>,
    checkpoint_lead: Option<Value>,
    stop_grace: Option<Value>,
    preemptible: Option<Value>,
    image: Option<Value>,
}

impl RawSpec {
    fn from_object(map: Map<String, Value>) -> Result<RawSpec, SpecError> {
        let mut raw = RawSpec::default();
        for (key, value) in map {
            let slot = match key.as_str() {
                // Already checked by `check_version`.
                "version" => continue,
                "id" => &mut raw.id,
                "name" => &mut raw.name,
                "comment" => &mut raw.comment,
                "command" => &mut raw.command,
                "workdir" => &mut raw.workdir,
                "env" => &mut raw.env,
                "credentials" => &mut raw.credentials,
                "gpus" => &mut raw.gpus,
                "timeout" => &mut raw.timeout,
                "idle_timeout" => &mut raw.idle_timeout,
                "user" => &mut raw.user,
                "priority" => &mut raw.priority,
                "resources" => &mut raw.resources,
                "after_ok" => &mut raw.after_ok,
                "after_fail" => &mut raw.after_fail,
                "after_any" => &mut raw.after_any,
                "sweep" => &mut raw.sweep,
                "max_parallel" => &mut raw.max_parallel,
                "notify" => &mut raw.notify,
                "notify_on" => &mut raw.notify_on,
                "hold" => &mut raw.hold,
                "begin" => &mut raw.begin,
                "retries" => &mut raw.retries,
                "retry_on" => &mut raw.retry_on,
                "retry_delay" => &mut raw.retry_delay,
                "requeue_exit_code" => &mut raw.requeue_exit_code,
                "checkpoint_signal" => &mut raw.checkpoint_signal,
                "checkpoint_lead" => &mut raw.checkpoint_lead,
                "stop_grace" => &mut raw.stop_grace,
                "preemptible" => &mut raw.preemptible,
                "image" => &mut raw.image,
                _ => {
                    return Err(SpecError::UnknownField {
                        field: quote(&key),
                        accepted: SPEC_FIELDS
                            .iter()
                            .map(|f| format!("`{f}`"))
                            .collect::<Vec<_>>()
                            .join(", "),
                    })
                }
            };
            if !value.is_null() {
                *slot = Some(value);
            }
        }
        Ok(raw)
    }

    fn validate(self, default_id: &str) -> Result<JobSpec, SpecError> {
        let id = match self.id {
            None => JobId::parse(default_id)?,
            Some(Value::String(s)) => JobId::try_from(s)?,
            Some(other) => return Err(wrong_type("id", "a string", &other, ID_HINT)),
        };
        let command = match self.command {
            None => return Err(missing_command()),
            Some(v) => validate_command(v)?,
        };
        let workdir = self.workdir.map(validate_workdir).transpose()?;
        let image = self.image.map(validate_image).transpose()?;
        let env = self.env.map(validate_env).transpose()?.unwrap_or_default();
        let credentials = self
            .credentials
            .map(validate_credentials)
            .transpose()?
            .unwrap_or_default();
        let gpus = self
            .gpus
            .map(|v| gpu_request::validate_gpus(&v))
            .transpose()?
            .unwrap_or_default();
        let timeout = self.timeout.map(|v| validate_timeout(&v)).transpose()?;
        let idle_timeout = self
            .idle_timeout
            .map(|v| validate_idle_timeout(&v).map_err(SpecError::IdleTimeout))
            .transpose()?;
        let user = self.user.map(validate_user).transpose()?;
        let name = self
            .name
            .map(|v| validate_text("name", v, MAX_NAME_CHARS, NAME_HINT))
            .transpose()?;
        let comment = self
            .comment
            .map(|v| validate_text("comment", v, MAX_COMMENT_CHARS, COMMENT_HINT))
            .transpose()?;
        let priority = self
            .priority
            .map(|v| validate_priority(&v))
            .transpose()?
            .unwrap_or(0);
        let resources = self
            .resources
            .map(|v| crate::resources::validate_request(&v).map_err(SpecError::Resources))
            .transpose()?
            .unwrap_or_default();
        let ids = |field: &str, v: Option<Value>| {
            v.map(|v| dependencies::parse_id_list(field, &v).map_err(SpecError::Chain))
                .transpose()
                .map(Option::unwrap_or_default)
        };
        let after = dependencies::Dependencies {
            after_ok: ids("after_ok", self.after_ok)?,
            after_fail: ids("after_fail", self.after_fail)?,
            after_any: ids("after_any", self.after_any)?,
        };
        if after.all().contains(&id) {
            return Err(SpecError::Chain(format!(
                "job {id} depends on itself (a cycle); remove {id} from its after_ok/after_fail/after_any"
            )));
        }
        let sweep =
            match (self.sweep, self.max_parallel) {
                (None, None) => None,
                (None, Some(_)) => return Err(SpecError::Chain(
                    "field `max_parallel` only applies to a `sweep`; add one or drop max_parallel"
                        .into(),
                )),
                (Some(s), mp) => {
                    Some(dependencies::parse_sweep(&s, mp.as_ref()).map_err(SpecError::Chain)?)
                }
            };
        let notify = self
            .notify
            .map(|v| notify::parse_notify(&v).map_err(SpecError::Notify))
            .transpose()?;
        let notify_on = self
            .notify_on
            .map(|v| notify::parse_notify_on(&v).map_err(SpecError::Notify))
            .transpose()?;
        let hold = match self.hold {
            None => false,
            Some(Value::Bool(b)) => b,
            Some(other) => return Err(wrong_type("hold", "true or false", &other, HOLD_HINT)),
        };
        let begin = self
            .begin
            .map(|v| begin::validate_begin(&v).map_err(SpecError::Begin))
            .transpose()?;
        let retry = retry::validate(
            self.retries.as_ref(),
            self.retry_on.as_ref(),
            self.retry_delay.as_ref(),
            self.requeue_exit_code.as_ref(),
        )
        .map_err(SpecError::Retry)?;
        let checkpoint = checkpoint::validate(
            self.checkpoint_signal.as_ref(),
            self.checkpoint_lead.as_ref(),
            timeout,
        )
        .map_err(SpecError::Checkpoint)?;
        let stop_grace = self
            .stop_grace
            .map(|v| checkpoint::validate_stop_grace(&v).map_err(SpecError::Checkpoint))
            .transpose()?;
        let preemptible = match self.preemptible {
            None => false,
            Some(Value::Bool(b)) => b,
            Some(other) => {
                return Err(wrong_type(
                    "preemptible",
                    "true or false",
                    &other,
                    "write \"preemptible\": true to let a more urgent job stop it (it runs again later), or omit it",
                ))
            }
        };
        Ok(JobSpec {
            id,
            command,
            workdir,
            env,
            gpus,
            timeout,
            idle_timeout,
            user,
            name,
            comment,
            priority,
            resources,
            after,
            sweep,
            notify,
            notify_on,
            credentials,
            hold,
            begin,
            retry,
            checkpoint,
            stop_grace,
            preemptible,
            image,
        })
    }
}

const IMAGE_HINT: &str = "write e.g. \"image\": \"registry.example.com/paddlepaddle/paddle:2.6-gpu-cuda11.8-cudnn8\" (or \"oci-archive:/srv/images/paddle.tar\", \"docker-archive:/srv/images/paddle.tar\", \"oci:/srv/images/paddle-layout:2.6\")";

/// `image`: the container image the job runs in, normalized as docker
/// names it ([`crate::images::ImageSource`]), so two spellings of one
/// image share one pull.
fn validate_image(v: Value) -> Result<String, SpecError> {
    let Value::String(text) = v else {
        return Err(wrong_type("image", "a string", &v, IMAGE_HINT));
    };
    crate::images::ImageSource::parse(&text)
        .map(|source| source.to_string())
        .map_err(|e| SpecError::Image(e.to_string()))
}

const HOLD_HINT: &str =
    "write \"hold\": true to submit it held (`ptrain release ID` lets it start), or omit it";

const NAME_HINT: &str = "write e.g. \"name\": \"resnet50, lr sweep\"";
const COMMENT_HINT: &str = "write e.g. \"comment\": \"baseline for the ablation\"";

/// `name` and `comment`: text only people read, shown on everyone's
/// terminal (escaped there too, [`crate::display`]); refused here when it
/// holds what a terminal would act on, so it always reads as written.
fn validate_text(
    field: &'static str,
    v: Value,
    max: usize,
    hint: &'static str,
) -> Result<String, SpecError> {
    let Value::String(text) = v else {
        return Err(wrong_type(field, "a string", &v, hint));
    };
    if text.trim().is_empty() {
        return Err(SpecError::TextEmpty { field });
    }
    let len = text.chars().count();
    if len > max {
        return Err(SpecError::TextTooLong { field, len, max });
    }
    if let Some((at, c)) = text
        .chars()
        .enumerate()
        .find(|&(_, c)| crate::display::is_unsafe(c))
    {
        return Err(SpecError::TextUnsafe {
            field,
            found: format!("U+{:04X}", c as u32),
            at: at + 1,
        });
    }
    Ok(text)
}

const ID_HINT: &str = "write e.g. \"id\": \"run-42\", or omit it to use the file name";

fn wrong_type(field: &str, expected: &'static str, v: &Value, hint: &'static str) -> SpecError {
    SpecError::WrongType {
        field: field.to_owned(),
        expected,
        found: kind(v),
        hint,
    }
}

fn missing_command() -> SpecError {
    SpecError::WrongType {
        field: "command".to_owned(),
        expected: "present",
        found: "missing",
        hint: "add the argv to run, e.g. \"command\": [\"python3\", \"train.py\"]",
    }
}

fn validate_command(v: Value) -> Result<Vec<String>, SpecError> {
    let items = match v {
        Value::Array(items) => items,
        Value::String(_) => return Err(SpecError::CommandIsString),
        other => {
            return Err(wrong_type(
                "command",
                "an array of strings (argv)",
                &other,
                "write e.g. [\"python3\", \"train.py\"]",
            ))
        }
    };
    if items.is_empty() {
        return Err(SpecError::CommandEmpty);
    }
    if items.len() > MAX_ARGV {
        return Err(SpecError::CommandTooLong { len: items.len() });
    }
    let mut argv = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        match item {
            // The strict parser already refuses NUL; checked again because
            // argv is handed to execve and must never be cut short silently.
            Value::String(s) if s.contains('\0') => {
                return Err(SpecError::NulInString {
                    location: format!("`command[{i}]`"),
                })
            }
            Value::String(s) => argv.push(s),
            other => {
                return Err(SpecError::WrongType {
                    field: format!("command[{i}]"),
                    expected: "a string",
                    found: kind(&other),
                    hint: "quote it, e.g. \"0.1\" instead of 0.1",
                })
            }
        }
    }
    if argv[0].is_empty() {
        return Err(SpecError::CommandProgramEmpty);
    }
    Ok(argv)
}

fn validate_workdir(v: Value) -> Result<PathBuf, SpecError> {
    let Value::String(s) = v else {
        return Err(wrong_type(
            "workdir",
            "a string (an absolute path)",
            &v,
            "write e.g. \"/home/alice/proj\"",
        ));
    };
    if s.contains('\0') {
        return Err(SpecError::NulInString {
            location: "`workdir`".to_owned(),
        });
    }
    if !s.starts_with('/') {
        return Err(SpecError::WorkdirNotAbsolute { path: quote(&s) });
    }
    // The workdir is the one user string that becomes unit properties
    // (WorkingDirectory, ReadWritePaths), which systemd 252 writes to the
    // transient file and parses again on daemon-reload.
    if let Some(c) = s
        .chars()
        .find(|c| matches!(c, '%' | '$' | '\\' | '"' | '\'') || c.is_control())
    {
        return Err(SpecError::WorkdirUnitSyntax {
            path: quote(&s),
            found: c.escape_default().to_string(),
        });
    }
    let mut normal = String::with_capacity(s.len());
    for comp in s.split('/') {
        match comp {
            "" | "." => {}
            // Refused rather than resolved: resolving `..` lexically is wrong
            // across symlinks, and the daemon should not guess.
            ".." => return Err(SpecError::WorkdirDotDot { path: quote(&s) }),
            c => {
                normal.push('/');
                normal.push_str(c);
            }
        }
    }
    if normal.is_empty() {
        normal.push('/');
    }
    if let Some(hidden) = JOB_PRIVATE_DIRS.iter().find(|dir| {
        normal
            .strip_prefix(**dir)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }) {
        return Err(SpecError::WorkdirPrivate {
            path: quote(&s),
            hidden,
        });
    }
    Ok(PathBuf::from(normal))
}

/// Directories each job unit gets a private, empty instance of
/// (`PrivateTmp=`, its own `/dev/shm`; see [`crate::unit`]): a workdir
/// there would fail to start or start empty.
const JOB_PRIVATE_DIRS: [&str; 3] = ["/tmp", "/var/tmp", "/dev/shm"];

fn validate_env(v: Value) -> Result<BTreeMap<String, String>, SpecError> {
    let Value::Object(map) = v else {
        return Err(wrong_type(
            "env",
            "an object of strings",
            &v,
            "write e.g. {\"OMP_NUM_THREADS\": \"8\"}",
        ));
    };
    if map.len() > MAX_ENV {
        return Err(SpecError::EnvTooMany { len: map.len() });
    }
    let mut env = BTreeMap::new();
    for (key, value) in map {
        if !is_env_name(&key) {
            return Err(SpecError::EnvBadKey { key: quote(&key) });
        }
        if let Some(why) = reserved_env(&key) {
            return Err(SpecError::EnvReserved { key, why });
        }
        match value {
            Value::String(s) if s.contains('\0') => {
                return Err(SpecError::NulInString {
                    location: format!("`env.{key}`"),
                })
            }
            Value::String(s) => {
                env.insert(key, s);
            }
            other => {
                return Err(SpecError::WrongType {
                    found: kind(&other),
                    field: format!("env.{key}"),
                    expected: "a string",
                    hint: "quote the value, e.g. \"8\" instead of 8",
                })
            }
        }
    }
    Ok(env)
}

/// `credentials`: `{"NAME": "/absolute/path"}`. Names become file names in
/// the job's `$CREDENTIALS_DIRECTORY`; `ptrain.` is ptraind's own prefix.
fn validate_credentials(v: Value) -> Result<BTreeMap<String, PathBuf>, SpecError> {
    const HINT: &str = "write e.g. {\"wandb\": \"/home/alice/.secrets/wandb\"}";
    let Value::Object(map) = v else {
        return Err(wrong_type("credentials", "an object of paths", &v, HINT));
    };
    let bad = |message: String| SpecError::Credentials(message);
    if map.len() > MAX_CREDENTIALS {
        return Err(bad(format!(
            "{} secrets, more than the limit of {MAX_CREDENTIALS}; put them in one file",
            map.len()
        )));
    }
    let mut out = BTreeMap::new();
    for (name, value) in map {
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && !name.starts_with('.')
            && !name.starts_with("ptrain.")
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !name_ok {
            return Err(bad(format!(
                "name {} is not a credential name; use up to 64 of [A-Za-z0-9._-], not starting with `.` or `ptrain.`",
                quote(&name)
            )));
        }
        let Value::String(path) = value else {
            return Err(wrong_type(
                &format!("credentials.{name}"),
                "a path string",
                &value,
                HINT,
            ));
        };
        if path.contains('\0') || !path.starts_with('/') {
            return Err(bad(format!(
                "`credentials.{name}`: {} is not an absolute path; name the file like /home/you/.secrets/{name}",
                quote(&path)
            )));
        }
        out.insert(name, PathBuf::from(path));
    }
    Ok(out)
}

/// `[A-Za-z_][A-Za-z0-9_]*`: the variable names field `env` accepts.
pub fn is_env_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Why `key` is reserved for the daemon, if it is.
pub fn reserved_env(key: &str) -> Option<&'static str> {
    if key.starts_with("PTRAIN_") {
        return Some("the PTRAIN_ prefix is reserved for variables ptraind sets");
    }
    RESERVED_ENV
        .iter()
        .find(|(name, _)| *name == key)
        .map(|(_, why)| *why)
}

/// What `ptrain update` may change of a queued job: the fields of the
/// descriptor that only order and time its start, each checked by the
/// same rules as in a job file. Pure.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Update {
    pub priority: Option<i32>,
    /// A delay counts from the update.
    pub begin: Option<begin::Begin>,
    pub timeout: Option<Duration>,
}

/// The fields [`parse_update`] takes.
pub const UPDATE_FIELDS: [&str; 3] = ["priority", "begin", "timeout"];

/// Parses an update, a JSON object of [`UPDATE_FIELDS`] (at least one);
/// the message names the field and the fix.
pub fn parse_update(text: &str) -> Result<Update, String> {
    if text.len() > MAX_SPEC_BYTES {
        return Err(format!("an update is at most {MAX_SPEC_BYTES} bytes"));
    }
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(text) else {
        return Err("an update is a JSON object such as {\"priority\": 10}".into());
    };
    let mut update = Update::default();
    for (key, value) in &map {
        match key.as_str() {
            "priority" => update.priority = Some(validate_priority(value).map_err(|e| e.to_string())?),
            "begin" => {
                update.begin = Some(
                    begin::validate_begin(value)
                        .map_err(|e| SpecError::Begin(e).to_string())?,
                )
            }
            "timeout" => update.timeout = Some(validate_timeout(value).map_err(|e| e.to_string())?),
            other => {
                return Err(format!(
                    "{} cannot be changed by an update; only {} can (stop the job and submit it again for the rest)",
                    quote(other),
                    UPDATE_FIELDS.map(|f| format!("`{f}`")).join(", ")
                ))
            }
        }
    }
    if update == Update::default() {
        return Err(format!(
            "an update names at least one of {}",
            UPDATE_FIELDS.map(|f| format!("`{f}`")).join(", ")
        ));
    }
    Ok(update)
}

fn validate_priority(v: &Value) -> Result<i32, SpecError> {
    match v.as_i64() {
        Some(p) if PRIORITY_RANGE.contains(&p) => Ok(p as i32),
        _ => Err(SpecError::PriorityInvalid {
            found: match v {
                Value::String(s) => quote(s),
                Value::Number(n) => n.to_string(),
                other => kind(other).to_owned(),
            },
        }),
    }
}

fn validate_timeout(v: &Value) -> Result<Duration, SpecError> {
    let d = match v {
        Value::String(s) => {
            humantime::parse_duration(s.trim()).map_err(|e| SpecError::TimeoutInvalid {
                value: quote(s),
                reason: e.to_string(),
            })?
        }
        Value::Number(n) => match n.as_u64() {
            Some(secs) => Duration::from_secs(secs),
            None => {
                return Err(SpecError::TimeoutInvalid {
                    value: n.to_string(),
                    reason: "a number must be a whole, non-negative count of seconds".to_owned(),
                })
            }
        },
        other => {
            return Err(wrong_type(
                "timeout",
                "a duration string or a number of seconds",
                other,
                "write e.g. \"12h\" or 3600",
            ))
        }
    };
    if d.is_zero() || d > MAX_TIMEOUT {
        return Err(SpecError::TimeoutOutOfRange {
            value: match v {
                Value::String(s) => quote(s),
                other => other.to_string(),
            },
        });
    }
    Ok(d)
}

/// Plausible login name: the shape useradd and systemd accept in practice. The
/// daemon compares it with the file owner's name, so this only keeps garbage
/// (and numeric uids, which would be ambiguous) out.
fn validate_user(v: Value) -> Result<String, SpecError> {
    let Value::String(s) = v else {
        return Err(wrong_type(
            "user",
            "a string (a login name)",
            &v,
            "write e.g. \"user\": \"alice\", or omit it",
        ));
    };
    let b = s.as_bytes();
    let body = b.strip_suffix(b"$").unwrap_or(b);
    let ok = !body.is_empty()
        && b.len() <= MAX_USER_LEN
        && (body[0].is_ascii_alphabetic() || body[0] == b'_')
        && body
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'));
    if ok {
        Ok(s)
    } else {
        Err(SpecError::InvalidUser { user: quote(&s) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn parse(s: &str) -> Result<JobSpec, SpecError> {
        parse_spec(s.as_bytes(), "job1")
    }

    fn err(s: &str) -> String {
        match parse(s) {
            Ok(spec) => panic!("expected an error for {s:?}, got {spec:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn assert_err_contains(s: &str, needles: &[&str]) {
        let msg = err(s);
        for n in needles {
            assert!(msg.contains(n), "error {msg:?} should contain {n:?}");
        }
    }

    #[test]
    fn spec_example_parses() {
        let spec = parse(
            r#"{"version": 1, "command": ["python3", "train.py", "--lr", "0.1"], "workdir": "/home/alice/proj", "gpus": 1, "timeout": "12h"}"#,
        )
        .unwrap();
        assert_eq!(spec.id.as_str(), "job1");
        assert_eq!(spec.command, ["python3", "train.py", "--lr", "0.1"]);
        assert_eq!(spec.workdir, Some(PathBuf::from("/home/alice/proj")));
        assert_eq!(spec.gpus.count(), 1);
        assert_eq!(spec.timeout, Some(Duration::from_secs(12 * 3600)));
        assert!(spec.env.is_empty());
        assert_eq!(spec.user, None);
    }

    #[test]
    fn the_image_example_is_a_valid_job_file() {
        let spec = parse_spec(
            include_bytes!("../spool-examples/paddle-ocr-image.json"),
            "paddle-ocr-image",
        )
        .unwrap();
        assert_eq!(
            spec.image.as_deref(),
            Some("registry.example.com/paddlepaddle/paddle:2.6-gpu-cuda11.8-cudnn8")
        );
        assert_eq!(spec.gpus.count(), 1);
        // Docker's defaults are written out, so two spellings share a pull.
        let spec = parse(r#"{"version":1,"command":["x"],"image":"ubuntu"}"#).unwrap();
        assert_eq!(
            spec.image.as_deref(),
            Some("docker.io/library/ubuntu:latest")
        );
        let spec =
            parse(r#"{"version":1,"command":["x"],"image":"oci-archive:/srv/i.tar:v2"}"#).unwrap();
        assert_eq!(spec.image.as_deref(), Some("oci-archive:/srv/i.tar:v2"));
        assert_err_contains(
            r#"{"version":1,"command":["x"],"image":"Bad Image!"}"#,
            &["field `image`", "Bad Image!"],
        );
        assert_err_contains(
            r#"{"version":1,"command":["x"],"image":["ubuntu"]}"#,
            &["image", "a string"],
        );
        assert_err_contains(
            r#"{"version":1,"command":["x"],"image":"oci-archive:relative.tar"}"#,
            &["field `image`"],
        );
    }

    #[test]
    fn minimal_spec_defaults() {
        let spec = parse(r#"{"version":1,"command":["true"]}"#).unwrap();
        assert_eq!(spec.gpus, GpuRequest::any(0));
        assert_eq!(spec.workdir, None);
        assert_eq!(spec.timeout, None);
        assert!(spec.env.is_empty());
    }

    #[test]
    fn full_spec_parses() {
        let spec = parse(
            r#"{"version":1,"id":"run-7.a_b","command":["sh","-c","echo hi"],
               "workdir":"//srv/./data//x/","env":{"OMP_NUM_THREADS":"8","HOME":"/tmp","_X1":""},
               "gpus":64,"timeout":3600,"user":"alice"}"#,
        )
        .unwrap();
        assert_eq!(spec.id.as_str(), "run-7.a_b");
        assert_eq!(spec.workdir, Some(PathBuf::from("/srv/data/x")));
        assert_eq!(spec.env.len(), 3);
        assert_eq!(spec.env["HOME"], "/tmp");
        assert_eq!(spec.gpus.count(), 64);
        assert_eq!(spec.timeout, Some(Duration::from_secs(3600)));
        assert_eq!(spec.user.as_deref(), Some("alice"));
    }

    #[test]
    fn null_means_absent() {
        let spec = parse(
            r#"{"version":1,"command":["x"],"workdir":null,"timeout":null,"gpus":null,"env":null,"user":null,"id":null}"#,
        )
        .unwrap();
        assert_eq!(spec.id.as_str(), "job1");
        assert_eq!(spec.gpus, GpuRequest::any(0));
        assert_eq!(spec.workdir, None);
    }

    #[test]
    fn size_limit() {
        let mut big = br#"{"version":1,"command":["x"],"env":{"A":""#.to_vec();
        big.resize(MAX_SPEC_BYTES + 1, b'a');
        let e = parse_spec(&big, "j").unwrap_err();
        assert!(matches!(e, SpecError::TooLarge), "{e}");
        assert!(e.to_string().contains("65536"));

        // Exactly at the limit is read (and here fails later for syntax).
        big.truncate(MAX_SPEC_BYTES);
        assert!(!matches!(
            parse_spec(&big, "j").unwrap_err(),
            SpecError::TooLarge
        ));
    }

    #[test]
    fn empty_file() {
        for s in ["", "   \n\t\r\n", "\u{feff}"] {
            let e = parse(s).unwrap_err();
            assert!(matches!(e, SpecError::Empty), "{s:?}: {e}");
            assert!(e.to_string().contains("empty"));
        }
    }

    #[test]
    fn byte_order_mark_is_ignored() {
        assert!(parse("\u{feff}{\"version\":1,\"command\":[\"x\"]}").is_ok());
    }

    #[test]
    fn invalid_utf8_reports_offset() {
        let bytes = b"{\"version\":1,\"command\":[\"\xff\"]}";
        let e = parse_spec(bytes, "j").unwrap_err();
        assert!(matches!(e, SpecError::InvalidUtf8 { offset: 25 }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("UTF-8") && msg.contains("offset 25"), "{msg}");
    }

    #[test]
    fn raw_nul_byte() {
        let e = parse_spec(b"{\"version\":1,\0}", "j").unwrap_err();
        assert!(matches!(e, SpecError::NulByte { offset: 13 }), "{e}");
        assert!(e.to_string().contains("NUL"));
    }

    #[test]
    fn escaped_nul_in_strings() {
        assert_err_contains(
            r#"{"version":1,"command":["a","b\u0000c"]}"#,
            &["`command[1]`", "NUL"],
        );
        assert_err_contains(
            r#"{"version":1,"command":["a"],"env":{"X":"a\u0000"}}"#,
            &["`env.X`", "NUL"],
        );
        assert_err_contains(
            r#"{"version":1,"command":["a"],"env":{"X\u0000":"a"}}"#,
            &["env", "NUL"],
        );
        assert_err_contains(
            r#"{"version":1,"command":["a"],"workdir":"/a\u0000b"}"#,
            &["`workdir`", "NUL"],
        );
        assert_err_contains(r#"{"version":1,"command":["\u0000"]}"#, &["command[0]"]);
    }

    #[test]
    fn deep_nesting_rejected_quickly() {
        let deep = format!(
            "{{\"version\":1,\"command\":[\"x\"],\"env\":{}{}}}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        let start = Instant::now();
        let e = parse(&deep).unwrap_err();
        assert!(start.elapsed().as_millis() < 500);
        assert!(matches!(e, SpecError::TooDeep { .. }), "{e}");
        assert!(e.to_string().contains("deeper than 32"));

        // Unterminated deep nesting, objects, and no closing at all.
        let e = parse_spec("{\"a\":".repeat(10_000).as_bytes(), "j").unwrap_err();
        assert!(matches!(e, SpecError::TooDeep { .. }), "{e}");
    }

    #[test]
    fn nesting_at_the_limit_is_parsed() {
        // 32 levels total (including the top-level object) is fine for the
        // pre-scan; it then fails as an unknown field, not as too deep.
        let inner = format!("{}{}", "[".repeat(31), "]".repeat(31));
        let s = format!("{{\"version\":1,\"command\":[\"x\"],\"extra\":{inner}}}");
        assert_eq!(s.matches('[').count(), 32);
        let e = parse(&s);
        // `command` adds a level only side by side, not nested.
        assert!(matches!(e, Err(SpecError::UnknownField { .. })), "{e:?}");

        let inner = format!("{}{}", "[".repeat(32), "]".repeat(32));
        let s = format!("{{\"version\":1,\"extra\":{inner}}}");
        assert!(matches!(parse(&s), Err(SpecError::TooDeep { .. })));
    }

    #[test]
    fn brackets_inside_strings_do_not_count() {
        let s = format!(
            r#"{{"version":1,"command":["{}", "\"[[[", "\\"]}}"#,
            "[".repeat(1000)
        );
        let spec = parse(&s).unwrap();
        assert_eq!(spec.command[0].len(), 1000);
        assert_eq!(spec.command[1], "\"[[[");
        assert_eq!(spec.command[2], "\\");
    }

    #[test]
    fn duplicate_keys_top_level() {
        let e = parse(r#"{"version":1,"command":["a"],"command":["b"]}"#).unwrap_err();
        assert!(matches!(e, SpecError::DuplicateKey { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("duplicate key \"command\""), "{msg}");
        assert!(msg.contains("top-level"), "{msg}");
    }

    #[test]
    fn duplicate_keys_nested() {
        assert_err_contains(
            r#"{"version":1,"command":["a"],"env":{"A":"1","B":"2","A":"3"}}"#,
            &["duplicate key \"A\"", "`env`"],
        );
        // Deeper and inside an array, even in a field that would be rejected.
        assert_err_contains(
            r#"{"version":1,"command":["a"],"x":[{"k":1},{"k":1,"k":2}]}"#,
            &["duplicate key \"k\"", "`x[1]`"],
        );
        assert_err_contains(
            r#"{"version":1,"version":1,"command":["a"]}"#,
            &["duplicate key \"version\""],
        );
    }

    #[test]
    fn truncated_json() {
        for s in [
            r#"{"version":1,"command":["a""#,
            r#"{"version":1,"#,
            r#"{"version""#,
            "{",
        ] {
            let e = parse(s).unwrap_err();
            assert!(matches!(e, SpecError::Truncated { .. }), "{s:?}: {e}");
            assert!(e.to_string().contains("line 1"));
        }
    }

    #[test]
    fn syntax_errors() {
        for s in [
            r#"{"version":1,}"#,
            r#"{version:1}"#,
            r#"{"version":1} trailing"#,
            r#"{"version":1}}"#,
            r#"]"#,
            r#"{"version":1,"command":['a']}"#,
            "{\"version\":1,\"command\":[\"a\tb\"]}",
        ] {
            let e = parse(s).unwrap_err();
            assert!(matches!(e, SpecError::Syntax { .. }), "{s:?}: {e}");
            let msg = e.to_string();
            assert!(
                msg.contains("not valid JSON") && msg.contains("line 1"),
                "{msg}"
            );
            assert_eq!(msg.matches(" at line ").count(), 1, "{msg}");
        }
    }

    #[test]
    fn top_level_must_be_object() {
        for (s, kind) in [
            ("[]", "an array"),
            ("1", "a number"),
            ("\"x\"", "a string"),
            ("null", "null"),
        ] {
            let e = parse(s).unwrap_err();
            assert!(matches!(e, SpecError::NotAnObject { .. }), "{s:?}: {e}");
            assert!(e.to_string().contains(kind));
        }
    }

    #[test]
    fn name_and_comment_are_one_line_of_plain_text_within_limits() {
        let spec = parse(
            r#"{"version":1,"command":["a"],"name":"ResNet-50, lr 0.1 — données","comment":"baseline"}"#,
        )
        .unwrap();
        assert_eq!(spec.name.as_deref(), Some("ResNet-50, lr 0.1 — données"));
        assert_eq!(spec.comment.as_deref(), Some("baseline"));
        let bare = parse(r#"{"version":1,"command":["a"],"name":null}"#).unwrap();
        assert_eq!((bare.name, bare.comment), (None, None));

        assert_err_contains(
            r#"{"version":1,"command":["a"],"name":3}"#,
            &["field `name` must be a string, not a number", "\"name\":"],
        );
        assert_err_contains(
            r#"{"version":1,"command":["a"],"comment":"  "}"#,
            &["field `comment` must not be empty", "omit the field"],
        );
        let long = format!(
            r#"{{"version":1,"command":["a"],"name":"{}"}}"#,
            "é".repeat(MAX_NAME_CHARS + 1)
        );
        assert_err_contains(
            &long,
            &[
                "field `name` has 129 characters, more than the limit of 128",
                "shorten it",
            ],
        );
        let fits = format!(
            r#"{{"version":1,"command":["a"],"comment":"{}"}}"#,
            "x".repeat(MAX_COMMENT_CHARS)
        );
        assert!(parse(&fits).is_ok());
        for (bad, found) in [
            (r"two\nlines", "U+000A at character 4"),
            (r"\u001b[2Jx", "U+001B at character 1"),
            (r"a\u202etxt", "U+202E at character 2"),
            (r"tab\there", "U+0009"),
        ] {
            for field in ["name", "comment"] {
                let msg = err(&format!(
                    r#"{{"version":1,"command":["a"],"{field}":"{bad}"}}"#
                ));
                assert!(
                    msg.contains(&format!("field `{field}` holds {found}")),
                    "{msg}"
                );
                assert!(msg.contains("one line of plain text"), "{msg}");
            }
        }
    }

    #[test]
    fn a_record_without_name_or_comment_still_loads() {
        let spec = parse(r#"{"version":1,"command":["a"]}"#).unwrap();
        let mut stored = serde_json::to_value(&spec).unwrap();
        assert!(
            stored.get("name").is_none(),
            "absent fields are not written"
        );
        let obj = stored.as_object_mut().unwrap();
        obj.remove("name");
        obj.remove("comment");
        let back: JobSpec = serde_json::from_value(stored).unwrap();
        assert_eq!(back, spec);
        let named = parse(r#"{"version":1,"command":["a"],"name":"n","comment":"c"}"#).unwrap();
        let back: JobSpec = serde_json::from_value(serde_json::to_value(&named).unwrap()).unwrap();
        assert_eq!(back, named);
    }

    #[test]
    fn version_rules() {
        assert_err_contains(r#"{"command":["a"]}"#, &["`version`", "missing"]);
        assert_err_contains(
            r#"{"version":"1","command":["a"]}"#,
            &["`version`", "\"1\""],
        );
        assert_err_contains(r#"{"version":1.0,"command":["a"]}"#, &["`version`"]);
        assert_err_contains(r#"{"version":-1,"command":["a"]}"#, &["`version`", "-1"]);
        assert_err_contains(
            r#"{"version":0,"command":["a"]}"#,
            &["unsupported version 0"],
        );
        // Version 2 with fields version 1 does not know: the version wins.
        let msg = err(r#"{"version":2,"command":["a"],"after_ok":["x"],"priority":3}"#);
        assert!(
            msg.contains("unsupported version 2; this ptraind reads version 1"),
            "{msg}"
        );
    }

    #[test]
    fn unknown_field_lists_accepted() {
        let msg = err(r#"{"version":1,"command":["a"],"gpu":1}"#);
        assert!(msg.contains("unknown field \"gpu\""), "{msg}");
        for f in SPEC_FIELDS {
            assert!(msg.contains(&format!("`{f}`")), "{msg} lacks {f}");
        }
        // Hostile field names are escaped and clipped.
        let long = "x\n".repeat(1000);
        let msg = err(&format!(
            r#"{{"version":1,"command":["a"],"{}":1}}"#,
            long.replace('\n', "\\n")
        ));
        assert!(!msg.contains('\n'));
        assert!(msg.len() < 600, "{}", msg.len());
    }

    #[test]
    fn all_fields_are_known() {
        let obj = SPEC_FIELDS
            .iter()
            .map(|f| format!("\"{f}\":{}", if *f == "version" { "1" } else { "null" }))
            .collect::<Vec<_>>()
            .join(",");
        // Every listed field is accepted; the error is the missing command.
        assert_err_contains(&format!("{{{obj}}}"), &["`command`", "missing"]);
    }

    #[test]
    fn id_rules() {
        let spec = parse(r#"{"version":1,"id":"A.b-c_9","command":["a"]}"#).unwrap();
        assert_eq!(spec.id.as_str(), "A.b-c_9");

        for bad in ["..", ".hidden", "a/b", "a\nb", "", "-x", "_x", "a b", "é"] {
            let s = serde_json::json!({"version": 1, "id": bad, "command": ["a"]}).to_string();
            let msg = err(&s);
            assert!(msg.contains("field `id`"), "{msg}");
            assert!(
                msg.contains(&format!("{bad:?}")),
                "{msg} should quote {bad:?}"
            );
        }
        let long = "a".repeat(300);
        let s = serde_json::json!({"version": 1, "id": long, "command": ["a"]}).to_string();
        let msg = err(&s);
        assert!(
            msg.contains("field `id`") && msg.contains("300 bytes"),
            "{msg}"
        );
        assert!(!msg.contains(&long));

        let a64 = "a".repeat(64);
        assert!(JobId::parse(&a64).is_ok());
        assert!(JobId::parse(&format!("{a64}a")).is_err());

        assert_err_contains(
            r#"{"version":1,"id":5,"command":["a"]}"#,
            &["field `id`", "a number"],
        );
    }

    #[test]
    fn default_id_is_validated() {
        let e = parse_spec(br#"{"version":1,"command":["a"]}"#, "../etc").unwrap_err();
        assert!(e.to_string().contains("\"../etc\""), "{e}");
        // An explicit id does not depend on the default.
        let spec = parse_spec(br#"{"version":1,"id":"ok","command":["a"]}"#, "").unwrap();
        assert_eq!(spec.id.as_str(), "ok");
    }

    #[test]
    fn job_id_helpers() {
        let id = JobId::parse("train-1").unwrap();
        assert_eq!(id.to_string(), "train-1");
        assert_eq!(id.unit_name(), "ptrain-job@train-1.service");
        assert_eq!(JobId::from_unit_name(&id.unit_name()), Some(id.clone()));
        assert_eq!(JobId::from_unit_name("ptrain-job@.service"), None);
        assert_eq!(JobId::from_unit_name("ptrain-job@a/b.service"), None);
        assert_eq!(JobId::from_unit_name("other@x.service"), None);
        assert_eq!(JobId::from_unit_name("ptrain-job@x.timer"), None);
        assert_eq!(JobId::from_unit_name("ptrain-job@x"), None);
        assert_eq!("train-1".parse::<JobId>().unwrap(), id);

        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"train-1\"");
        assert_eq!(serde_json::from_str::<JobId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<JobId>("\"../x\"").is_err());
    }

    #[test]
    fn spool_file_names() {
        assert_eq!(spool_file_stem("train.json"), Some("train"));
        assert_eq!(spool_file_stem("a.b-c_d.json"), Some("a.b-c_d"));
        assert_eq!(spool_file_stem("9.json"), Some("9"));
        let long = format!("{}.json", "a".repeat(64));
        assert_eq!(spool_file_stem(&long), Some(&long[..64]));
        for bad in [
            ".json",
            ".train.json",
            ".train.json.swp",
            "train.json~",
            "#train.json#",
            ".#train.json",
            "train.json.tmp",
            "train.JSON",
            "train",
            "tr ain.json",
            "a/b.json",
            "-x.json",
            "",
        ] {
            assert_eq!(spool_file_stem(bad), None, "{bad:?}");
        }
        assert_eq!(spool_file_stem(&format!("{}.json", "a".repeat(65))), None);
    }

    #[test]
    fn command_rules() {
        let msg = err(r#"{"version":1,"command":"python3 train.py"}"#);
        assert!(
            msg.contains("field `command` must be an array of strings (argv), not a shell string")
        );
        assert!(msg.contains("[\"sh\", \"-c\", \"...\"]"));

        assert_err_contains(r#"{"version":1}"#, &["field `command`", "missing"]);
        assert_err_contains(
            r#"{"version":1,"command":[]}"#,
            &["field `command`", "empty"],
        );
        assert_err_contains(r#"{"version":1,"command":[""]}"#, &["`command[0]`"]);
        assert_err_contains(
            r#"{"version":1,"command":["python3","--lr",0.1]}"#,
            &["field `command[2]`", "a number", "quote"],
        );
        assert_err_contains(
            r#"{"version":1,"command":{"a":1}}"#,
            &["field `command`", "an object"],
        );

        // An empty later argument is legitimate.
        assert_eq!(
            parse(r#"{"version":1,"command":["a",""]}"#)
                .unwrap()
                .command,
            ["a", ""]
        );

        let many = vec!["x"; MAX_ARGV + 1];
        let s = serde_json::json!({"version": 1, "command": many}).to_string();
        assert_err_contains(&s, &["field `command`", "4097", "4096"]);
        let ok = vec!["x"; MAX_ARGV];
        let s = serde_json::json!({"version": 1, "command": ok}).to_string();
        assert_eq!(parse(&s).unwrap().command.len(), MAX_ARGV);
    }

    #[test]
    fn workdir_rules() {
        let wd = |p: &str| {
            let s = serde_json::json!({"version": 1, "command": ["a"], "workdir": p}).to_string();
            parse(&s).map(|s| s.workdir.unwrap())
        };
        assert_eq!(wd("/").unwrap(), PathBuf::from("/"));
        assert_eq!(wd("//").unwrap(), PathBuf::from("/"));
        assert_eq!(wd("/./.").unwrap(), PathBuf::from("/"));
        assert_eq!(wd("/a//b/./c/").unwrap(), PathBuf::from("/a/b/c"));
        assert_eq!(wd("/a/..b/c..").unwrap(), PathBuf::from("/a/..b/c.."));
        for bad in ["relative/path", "./x", "", "~/proj"] {
            let msg = wd(bad).unwrap_err().to_string();
            assert!(
                msg.contains("field `workdir`") && msg.contains("absolute"),
                "{msg}"
            );
        }
        for bad in [
            "/home/a/%h",
            "/data/$USER",
            "/a\\b",
            "/a\nb",
            "/q\"x",
            "/it's",
        ] {
            let msg = wd(bad).unwrap_err().to_string();
            assert!(
                msg.contains("field `workdir`") && msg.contains("systemd would read"),
                "{msg}"
            );
        }
        assert_eq!(
            wd("/data/exp 1/run-2.0_x").unwrap(),
            PathBuf::from("/data/exp 1/run-2.0_x")
        );
        for hidden in ["/tmp", "//tmp/x", "/var/tmp/run", "/dev/shm/a"] {
            let msg = wd(hidden).unwrap_err().to_string();
            assert!(msg.contains("private, empty copy"), "{msg}");
        }
        assert_eq!(wd("/tmpdata").unwrap(), PathBuf::from("/tmpdata"));
        for bad in ["/a/../b", "/..", "/a/.."] {
            let msg = wd(bad).unwrap_err().to_string();
            assert!(
                msg.contains("field `workdir`") && msg.contains(".."),
                "{msg}"
            );
        }
        assert_err_contains(
            r#"{"version":1,"command":["a"],"workdir":7}"#,
            &["field `workdir`"],
        );
    }

    #[test]
    fn env_rules() {
        let env = |e: Value| {
            let s = serde_json::json!({"version": 1, "command": ["a"], "env": e}).to_string();
            parse(&s).map(|s| s.env)
        };
        let ok = env(serde_json::json!({"LD_LIBRARY_PATH": "/opt/cuda/lib64", "HOME": "/scratch", "a_1": "x"}))
            .unwrap();
        assert_eq!(ok.len(), 3);

        for reserved in [
            "CUDA_VISIBLE_DEVICES",
            "CUDA_DEVICE_ORDER",
            "NVIDIA_VISIBLE_DEVICES",
            "PTRAIN_JOB_ID",
            "PTRAIN_",
            "LD_PRELOAD",
            "LD_AUDIT",
            "USER",
            "LOGNAME",
        ] {
            let mut m = Map::new();
            m.insert(reserved.to_owned(), Value::String("x".into()));
            let msg = env(Value::Object(m)).unwrap_err().to_string();
            assert!(
                msg.contains("field `env`") && msg.contains(reserved),
                "{msg}"
            );
        }
        assert!(env(serde_json::json!({"CUDA_VISIBLE_DEVICES": "0"}))
            .unwrap_err()
            .to_string()
            .contains("field `gpus`"));

        for bad in ["1X", "A-B", "A=B", "", "A B", "É"] {
            let mut m = Map::new();
            m.insert(bad.to_owned(), Value::String("x".into()));
            let msg = env(Value::Object(m)).unwrap_err().to_string();
            assert!(
                msg.contains("field `env`") && msg.contains("invalid variable name"),
                "{msg}"
            );
        }

        let msg = env(serde_json::json!({"N": 8})).unwrap_err().to_string();
        assert!(
            msg.contains("field `env.N`") && msg.contains("a number"),
            "{msg}"
        );
        let msg = env(serde_json::json!(["A=1"])).unwrap_err().to_string();
        assert!(
            msg.contains("field `env`") && msg.contains("an array"),
            "{msg}"
        );

        let big: Map<String, Value> = (0..=MAX_ENV)
            .map(|i| (format!("V{i}"), Value::String(String::new())))
            .collect();
        let msg = env(Value::Object(big)).unwrap_err().to_string();
        assert!(msg.contains("field `env`") && msg.contains("1025"), "{msg}");
    }

    #[test]
    fn gpus_rules() {
        let gpus = |g: &str| parse(&format!(r#"{{"version":1,"command":["a"],"gpus":{g}}}"#));
        assert_eq!(gpus("0").unwrap().gpus.count(), 0);
        assert_eq!(gpus("64").unwrap().gpus.count(), 64);
        for bad in [
            "65",
            "-1",
            "1.5",
            "1e3",
            "\"2\"",
            "true",
            "[1]",
            "18446744073709551616",
        ] {
            let msg = gpus(bad).unwrap_err().to_string();
            assert!(msg.contains("field `gpus`"), "{bad}: {msg}");
        }
        // The object form, through the whole parser (nesting, strictness).
        let r =
            gpus(r#"{"count": 2, "model": "A100", "min_memory": "40GiB", "indices": [0, 1, 2]}"#)
                .unwrap()
                .gpus;
        assert_eq!(r.count(), 2);
        assert_eq!(r.model.as_deref(), Some("A100"));
        let msg = gpus(r#"{"count": 1, "count": 2}"#).unwrap_err().to_string();
        assert!(msg.contains("duplicate key"), "{msg}");
        let msg = gpus(r#"{"count": 1, "vram": 2}"#).unwrap_err().to_string();
        assert!(
            msg.contains("field `gpus`") && msg.contains("\"vram\""),
            "{msg}"
        );
    }

    #[test]
    fn priority_rules() {
        let p = |v: &str| {
            parse(&format!(
                r#"{{"version":1,"command":["a"],"priority":{v}}}"#
            ))
            .map(|s| s.priority)
        };
        assert_eq!(p("0").unwrap(), 0);
        assert_eq!(p("100").unwrap(), 100);
        assert_eq!(p("-100").unwrap(), -100);
        assert_eq!(p("null").unwrap(), 0);
        assert_eq!(
            parse(r#"{"version":1,"command":["a"]}"#).unwrap().priority,
            0
        );
        for bad in [
            "101",
            "-101",
            "1.5",
            "\"high\"",
            "true",
            "[1]",
            "99999999999999999999",
        ] {
            let msg = p(bad).unwrap_err().to_string();
            assert!(
                msg.contains("field `priority`") && msg.contains("-100 to 100"),
                "{bad}: {msg}"
            );
        }
        // Records written before the field existed load with priority 0.
        let old = r#"{"id":"a","command":["x"]}"#;
        assert_eq!(serde_json::from_str::<JobSpec>(old).unwrap().priority, 0);
    }

    #[test]
    fn an_update_takes_priority_begin_and_timeout_by_the_job_files_rules() {
        let update = parse_update(r#"{"priority": 50, "begin": "2h", "timeout": "3h"}"#).unwrap();
        assert_eq!(update.priority, Some(50));
        assert_eq!(
            update.begin,
            Some(begin::Begin::After(Duration::from_secs(7200)))
        );
        assert_eq!(update.timeout, Some(Duration::from_secs(3 * 3600)));
        for (bad, says) in [
            (r#"{"priority": 101}"#, "field `priority`"),
            (r#"{"timeout": "0s"}"#, "field `timeout`"),
            (r#"{"begin": "2020-01-01T00:00:00"}"#, "field `begin`"),
            (
                r#"{"command": ["x"]}"#,
                "only `priority`, `begin`, `timeout`",
            ),
            (r#"{}"#, "at least one"),
            (r#"[1]"#, "a JSON object"),
        ] {
            let e = parse_update(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn timeout_rules() {
        let t = |v: &str| {
            parse(&format!(r#"{{"version":1,"command":["a"],"timeout":{v}}}"#))
                .map(|s| s.timeout.unwrap())
        };
        assert_eq!(t("\"90m\"").unwrap(), Duration::from_secs(90 * 60));
        assert_eq!(t("\"1h30m\"").unwrap(), Duration::from_secs(5400));
        assert_eq!(t("\"45s\"").unwrap(), Duration::from_secs(45));
        assert_eq!(t("\"365days\"").unwrap(), MAX_TIMEOUT);
        assert_eq!(t("45").unwrap(), Duration::from_secs(45));
        assert_eq!(t("31536000").unwrap(), MAX_TIMEOUT);
        for bad in [
            "\"soon\"",
            "\"12\"",
            "\"h\"",
            "-5",
            "1.5",
            "true",
            "\"99999999999999999999999y\"",
        ] {
            let msg = t(bad).unwrap_err().to_string();
            assert!(msg.contains("field `timeout`"), "{bad}: {msg}");
        }
        for out in [
            "0",
            "\"0s\"",
            "\"366days\"",
            "\"1y\"",
            "31536001",
            "18446744073709551615",
        ] {
            let msg = t(out).unwrap_err().to_string();
            assert!(
                msg.contains("field `timeout`") && msg.contains("365 days"),
                "{out}: {msg}"
            );
        }
    }

    #[test]
    fn user_rules() {
        let u = |v: &str| {
            let s = serde_json::json!({"version": 1, "command": ["a"], "user": v}).to_string();
            parse(&s).map(|s| s.user.unwrap())
        };
        for ok in ["alice", "_svc", "bob.smith", "a-b_c9", "machine$"] {
            assert_eq!(u(ok).unwrap(), ok);
        }
        for bad in [
            "",
            "1000",
            "-x",
            "al ice",
            "a/b",
            "a:b",
            "root\n",
            "$",
            &"a".repeat(256),
        ] {
            let msg = u(bad).unwrap_err().to_string();
            assert!(msg.contains("field `user`"), "{bad:?}: {msg}");
        }
        assert_err_contains(
            r#"{"version":1,"command":["a"],"user":0}"#,
            &["field `user`"],
        );
    }

    #[test]
    fn jobspec_serde_round_trip() {
        let spec = parse(
            r#"{"version":1,"id":"rt","command":["python3","t.py"],"workdir":"/w","env":{"A":"1"},
               "gpus":2,"timeout":"1h30m","user":"alice"}"#,
        )
        .unwrap();
        let json = serde_json::to_string(&spec).unwrap();
        assert!(json.contains("\"timeout\":\"1h 30m\""), "{json}");
        let back: JobSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, spec);

        let mut odd = spec.clone();
        for d in [
            Duration::from_nanos(1),
            Duration::new(59, 999_999_999),
            MAX_TIMEOUT,
            Duration::from_secs(2_630_016 + 1),
        ] {
            odd.timeout = Some(d);
            let back: JobSpec =
                serde_json::from_str(&serde_json::to_string(&odd).unwrap()).unwrap();
            assert_eq!(back, odd);
        }
        odd.timeout = None;
        odd.workdir = None;
        odd.user = None;
        let back: JobSpec = serde_json::from_str(&serde_json::to_string(&odd).unwrap()).unwrap();
        assert_eq!(back, odd);

        // Integer seconds are accepted too; an invalid id is not.
        let v = json.replace("\"1h 30m\"", "5400");
        assert_eq!(serde_json::from_str::<JobSpec>(&v).unwrap(), spec);
        let v = json.replace("\"rt\"", "\"../x\"");
        assert!(serde_json::from_str::<JobSpec>(&v).is_err());

        // Optional fields may be missing from an older record.
        let min: JobSpec = serde_json::from_str(r#"{"id":"m","command":["x"]}"#).unwrap();
        assert_eq!(
            (min.gpus.count(), min.timeout, min.env.len(), min.priority),
            (0, None, 0, 0)
        );
    }

    #[test]
    fn hostile_inputs_do_not_panic() {
        let inputs: Vec<Vec<u8>> = vec![
            b"\"".to_vec(),
            b"\"\\".to_vec(),
            b"{\"\\u".to_vec(),
            b"{\"\\ud800\":1}".to_vec(),
            b"[[[[]]]]]]]]]]".to_vec(),
            b"}}}}{{{{".to_vec(),
            b"1e999999".to_vec(),
            b"-".to_vec(),
            b"{\"version\":1e400}".to_vec(),
            b"{\"version\":18446744073709551616}".to_vec(),
            b"\xef\xbb".to_vec(),
            vec![b'['; MAX_SPEC_BYTES],
            vec![b' '; MAX_SPEC_BYTES + 1],
            vec![0xff; 10],
        ];
        for input in inputs {
            assert!(parse_spec(&input, "j").is_err());
        }
    }

    #[test]
    fn many_small_values_within_limit() {
        // A wide but shallow document at the size limit parses in bounded time.
        let n = (MAX_SPEC_BYTES - 64) / 4;
        let s = format!(
            r#"{{"version":1,"command":["a"],"x":[{}]}}"#,
            vec!["1"; n].join(",")
        );
        let start = Instant::now();
        assert!(matches!(parse(&s), Err(SpecError::UnknownField { .. })));
        assert!(start.elapsed().as_millis() < 1000);
    }

    #[test]
    fn hold_is_a_boolean_kept_only_when_true() {
        let held = parse(r#"{"version": 1, "command": ["true"], "hold": true}"#).unwrap();
        assert!(held.hold);
        let stored = serde_json::to_string(&held).unwrap();
        assert!(stored.contains(r#""hold":true"#), "{stored}");
        let plain = parse(r#"{"version": 1, "command": ["true"], "hold": false}"#).unwrap();
        assert!(!plain.hold);
        assert!(!serde_json::to_string(&plain).unwrap().contains("hold"));
        let msg = err(r#"{"version": 1, "command": ["true"], "hold": "yes"}"#);
        assert!(
            msg.contains("`hold`") && msg.contains("ptrain release"),
            "{msg}"
        );
    }

    #[test]
    fn messages_are_lowercase_and_have_hints() {
        let samples = [
            SpecError::TooLarge,
            SpecError::Empty,
            SpecError::MissingVersion,
            SpecError::CommandIsString,
            SpecError::CommandEmpty,
            SpecError::CommandProgramEmpty,
            SpecError::UnsupportedVersion { version: 2 },
        ];
        for e in samples {
            let msg = e.to_string();
            assert!(msg.chars().next().unwrap().is_lowercase(), "{msg}");
            assert!(msg.contains(';'), "{msg}");
        }
    }
}
