//! A fuzz test for the descriptor parser and name validation that runs on
//! the stable toolchain, as an ordinary `cargo test` target.
//!
//! It feeds random bytes, mutations of valid descriptors and random but
//! well-formed JSON objects to [`parse_spec`], and random names to
//! [`spool_file_stem`] and [`JobId::parse`], and checks properties that must
//! hold for every input (see the `check_*` functions): nothing panics, what
//! is accepted obeys the documented rules (checked here by an independent
//! implementation of the name regex), accepted specs round-trip through
//! serde, and every error message is one bounded, non-empty line.
//!
//! By default a short run (`PTRAIN_FUZZ_ITERS`, default 20,000 inputs, a few
//! seconds) with a fresh random seed; a failure prints the seed, the
//! iteration and the input. Longer runs and replays:
//!
//! ```text
//! # about a minute per million inputs in release mode
//! PTRAIN_FUZZ_ITERS=5000000 cargo test --release --test fuzz_spec -- --nocapture
//! # replay a failure
//! PTRAIN_FUZZ_SEED=1234 PTRAIN_FUZZ_ITERS=20000 cargo test --test fuzz_spec
//! ```
//!
//! `fuzz/` holds a coverage-guided cargo-fuzz target (nightly only, not run
//! in CI) that applies the same `check_*` properties.
#![allow(dead_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};

use ptrain::spec::{parse_spec, spool_file_stem, JobId, JobSpec, MAX_SPEC_BYTES, SPEC_FIELDS};
use serde_json::Value;

/// Longest error message accepted: a reason is logged, stored and shown in
/// `ptrain rejected`, so a hostile file must not be able to make it large.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`, written independently of the
/// implementation under test.
pub fn id_matches_regex(s: &str) -> bool {
    let mut chars = s.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    first.is_ascii_alphanumeric()
        && s.chars().count() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-')
}

/// `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\.json$`.
pub fn file_name_matches_regex(s: &str) -> bool {
    s.len() > 5 && s.ends_with(".json") && id_matches_regex(&s[..s.len() - 5])
}

/// An error message a person can read in a log line.
pub fn check_message(what: &str, msg: &str) -> Result<(), String> {
    if msg.is_empty() {
        return Err(format!("{what}: empty error message"));
    }
    if msg.len() > MAX_MESSAGE_BYTES {
        return Err(format!(
            "{what}: error message of {} bytes (limit {MAX_MESSAGE_BYTES}): {:?}…",
            msg.len(),
            &msg[..msg.char_indices().nth(200).map_or(msg.len(), |(i, _)| i)]
        ));
    }
    if let Some(c) = msg.chars().find(|c| c.is_control()) {
        return Err(format!(
            "{what}: control character {c:?} in error message {msg:?}"
        ));
    }
    if !msg.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(format!("{what}: message does not start lowercase: {msg:?}"));
    }
    Ok(())
}

fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("{what} panicked: {msg}")
    })
}

/// Every property of `parse_spec` for one input; `Ok(true)` when the input
/// was accepted.
pub fn check_parse(bytes: &[u8], default_id: &str) -> Result<bool, String> {
    let result = no_panic("parse_spec", || parse_spec(bytes, default_id))?;
    match result {
        Err(e) => check_message("parse_spec", &e.to_string()).map(|()| false),
        Ok(spec) => check_accepted(bytes, &spec).map(|()| true),
    }
}

/// What an accepted descriptor must satisfy. Checked on the serialised
/// form, so fields added later do not need changes here.
fn check_accepted(input: &[u8], spec: &JobSpec) -> Result<(), String> {
    let fail = |why: String| Err(format!("accepted, but {why}"));
    if input.len() > MAX_SPEC_BYTES {
        return fail(format!("the input is {} bytes", input.len()));
    }
    if !id_matches_regex(spec.id.as_str()) {
        return fail(format!("id {:?} breaks the id rule", spec.id.as_str()));
    }
    let json = serde_json::to_string(spec).map_err(|e| format!("does not serialise: {e}"))?;
    let back: JobSpec =
        serde_json::from_str(&json).map_err(|e| format!("does not deserialise: {e}: {json}"))?;
    if &back != spec {
        return fail(format!("serde round trip changed it: {spec:?} -> {back:?}"));
    }
    let value: Value = serde_json::from_str(&json).unwrap();

    let Some(command) = value["command"].as_array() else {
        return fail(format!("command is not an array: {json}"));
    };
    let argv: Vec<&str> = command.iter().filter_map(Value::as_str).collect();
    if argv.is_empty() || argv.len() != command.len() || argv[0].is_empty() {
        return fail(format!("bad argv {command:?}"));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return fail(format!("NUL in argv {argv:?}"));
    }
    if let Some(env) = value["env"].as_object() {
        for (k, v) in env {
            let name_ok = k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            let reserved = k.starts_with("PTRAIN_")
                || ["CUDA_VISIBLE_DEVICES", "LD_PRELOAD"].contains(&k.as_str());
            if !name_ok || reserved {
                return fail(format!("env key {k:?} is invalid or reserved"));
            }
            if v.as_str().is_none_or(|v| v.contains('\0')) {
                return fail(format!("env value {v:?}"));
            }
        }
    }
    if let Some(workdir) = value["workdir"].as_str() {
        let normal = workdir == "/"
            || (workdir.starts_with('/')
                && workdir[1..]
                    .split('/')
                    .all(|c| !matches!(c, "" | "." | "..")));
        if !normal || workdir.contains('\0') {
            return fail(format!("workdir {workdir:?} is not a normal absolute path"));
        }
    }

    // What is stored is what a user could have written: the core fields
    // of the stored form, with `version`, parse back to the same values
    // (normalisation is idempotent, durations print in a form the parser
    // reads). Fields added later may store a different shape than users
    // write, so only these are compared.
    const CORE: &[&str] = &["id", "command", "workdir", "env", "timeout", "user"];
    let mut canonical = serde_json::Map::new();
    canonical.insert("version".into(), Value::from(1));
    for k in CORE {
        if let Some(v) = value.get(*k).filter(|v| !v.is_null()) {
            canonical.insert((*k).to_owned(), v.clone());
        }
    }
    let canonical = Value::Object(canonical).to_string();
    match parse_spec(canonical.as_bytes(), "unused-default") {
        Ok(again) => {
            let again = serde_json::to_value(&again).unwrap();
            match CORE.iter().find(|k| again.get(**k) != value.get(**k)) {
                None => Ok(()),
                Some(k) => fail(format!(
                    "its canonical form {canonical} parses to a different `{k}`: {:?}",
                    again.get(*k)
                )),
            }
        }
        Err(e) => fail(format!("its canonical form {canonical} is rejected: {e}")),
    }
}

/// Every property of `spool_file_stem` and `JobId` for one name; `Ok(true)`
/// when it is a valid job id.
pub fn check_name(name: &str) -> Result<bool, String> {
    let stem = no_panic("spool_file_stem", || spool_file_stem(name))?;
    match stem {
        Some(stem) if format!("{stem}.json") != name || !file_name_matches_regex(name) => {
            return Err(format!("spool_file_stem({name:?}) = {stem:?}"));
        }
        None if file_name_matches_regex(name) => {
            return Err(format!("spool_file_stem refused the valid name {name:?}"));
        }
        _ => {}
    }
    let parsed = no_panic("JobId::parse", || JobId::parse(name))?;
    match parsed {
        Ok(id) => {
            if !id_matches_regex(name) || id.as_str() != name {
                return Err(format!("JobId::parse accepted {name:?}"));
            }
            let unit = id.unit_name();
            if unit.len() > 255
                || !unit
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "@._-".contains(c))
            {
                return Err(format!("unit name {unit:?} needs escaping"));
            }
            if JobId::from_unit_name(&unit).as_ref() != Some(&id) {
                return Err(format!("unit name {unit:?} does not map back to {name:?}"));
            }
            let json = serde_json::to_string(&id).unwrap();
            if serde_json::from_str::<JobId>(&json).ok().as_ref() != Some(&id) {
                return Err(format!("JobId {name:?} does not round-trip through serde"));
            }
        }
        Err(e) => {
            if id_matches_regex(name) {
                return Err(format!("JobId::parse refused the valid id {name:?}"));
            }
            check_message("JobId::parse", &e.to_string())?;
            // Refused at the serde boundary too (records are read back).
            let json = serde_json::to_string(name).unwrap();
            if serde_json::from_str::<JobId>(&json).is_ok() {
                return Err(format!("serde accepted the invalid id {name:?}"));
            }
        }
    }
    let from_unit = no_panic("JobId::from_unit_name", || JobId::from_unit_name(name))?;
    if let Some(id) = from_unit {
        if id.unit_name() != name {
            return Err(format!("from_unit_name({name:?}) = {id}"));
        }
    }
    Ok(id_matches_regex(name))
}

// ---------------------------------------------------------------------------
// Input generation.

/// Valid descriptors the mutations start from.
pub const SEEDS: &[&str] = &[
    r#"{"version": 1, "command": ["true"]}"#,
    r#"{"version":1,"id":"rt-1","command":["python3","t.py","--lr","0.1"],"workdir":"/home/a/p","env":{"A":"1","OMP_NUM_THREADS":"8"},"gpus":2,"timeout":"1h30m","user":"alice"}"#,
    r#"{"version":1,"command":["/bin/sh","-c","echo $HOME > out"],"timeout":3600,"gpus":0,"env":{},"workdir":"/"}"#,
    r#"{"version":1,"id":null,"command":["a",""],"workdir":null,"env":null,"gpus":null,"timeout":null,"user":null}"#,
    "\u{feff}{\"version\": 1, \"command\": [\"\\u00e9\\ud83d\\ude00\", \"\\n\\t\"]}",
    "{\n  \"version\": 1,\n  \"id\": \"A.b-c_9\",\n  \"command\": [\"x\"],\n  \"workdir\": \"/a//b/./c/\"\n}\n",
    r#"{"version":1,"command":["x"],"timeout":"365days","user":"machine$"}"#,
];

/// Fragments that tend to hit edge cases when spliced in.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "\\u0000",
    "\\ud800",
    "\\u",
    "\u{0}",
    "null",
    "true",
    "-1",
    "0",
    "1e999",
    "-0",
    "1.5",
    "18446744073709551616",
    "4294967296",
    "\"..\"",
    "\"/\"",
    "\"a/b\"",
    "\"\"",
    "\".\"",
    "\"a\\nb\"",
    "\"root\"",
    "\"0\"",
    "\"CUDA_VISIBLE_DEVICES\"",
    "\"PTRAIN_X\"",
    "\"LD_PRELOAD\"",
    "\"A=B\"",
    "\"after_ok\"",
    "\"365days\"",
    "\"366days\"",
    "\"0s\"",
    "\"1ns\"",
    "\"99999999999999999999y\"",
    "[[[[[[[[[[[[[[[[",
    "]]]]]]]]",
    "{\"a\":{\"a\":{\"a\":",
    "\u{feff}",
    "é",
    "\u{202e}",
    "\u{7f}",
    "\r\n",
    "\t",
];

pub struct Gen {
    rng: fastrand::Rng,
}

impl Gen {
    pub fn new(seed: u64) -> Gen {
        Gen {
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// One descriptor input: mostly mutated seeds and structured objects,
    /// some pure noise.
    pub fn descriptor(&mut self) -> Vec<u8> {
        match self.rng.u8(0..10) {
            0 => self.noise(),
            1..=4 => self.mutated(),
            5..=8 => self.structured(),
            _ => self.nested(),
        }
    }

    fn noise(&mut self) -> Vec<u8> {
        let len = self.rng.usize(0..200);
        if self.rng.bool() {
            (0..len).map(|_| self.rng.u8(..)).collect()
        } else {
            // JSON-ish bytes only, so the parser gets further.
            let alphabet = b"{}[]\",:0123456789-.eEtrufalsn \\u\n";
            (0..len)
                .map(|_| alphabet[self.rng.usize(..alphabet.len())])
                .collect()
        }
    }

    fn mutated(&mut self) -> Vec<u8> {
        let mut b = SEEDS[self.rng.usize(..SEEDS.len())].as_bytes().to_vec();
        for _ in 0..self.rng.usize(1..5) {
            self.mutate(&mut b);
        }
        b
    }

    fn mutate(&mut self, b: &mut Vec<u8>) {
        let pos = |rng: &mut fastrand::Rng, b: &Vec<u8>| rng.usize(0..=b.len());
        match self.rng.u8(0..8) {
            0 if !b.is_empty() => {
                let i = self.rng.usize(..b.len());
                b[i] ^= 1 << self.rng.u8(0..8);
            }
            1 if !b.is_empty() => {
                let i = self.rng.usize(..b.len());
                b[i] = *self
                    .rng
                    .choice(b"\0\xff\"\\{}[],:\n./-\xc3\x80 09")
                    .unwrap();
            }
            2 | 3 => {
                let t = TOKENS[self.rng.usize(..TOKENS.len())].as_bytes();
                let i = pos(&mut self.rng, b);
                b.splice(i..i, t.iter().copied());
            }
            4 if !b.is_empty() => {
                let i = self.rng.usize(..b.len());
                let j = self.rng.usize(i..=b.len().min(i + 16));
                b.drain(i..j);
            }
            5 if !b.is_empty() => {
                // Duplicate a range: duplicate keys, repeated values.
                let i = self.rng.usize(..b.len());
                let j = self.rng.usize(i..=b.len().min(i + 40));
                let chunk: Vec<u8> = b[i..j].to_vec();
                let k = pos(&mut self.rng, b);
                b.splice(k..k, chunk);
            }
            6 => {
                let i = pos(&mut self.rng, b);
                b.truncate(i);
            }
            _ => {
                // A field name, quoted, somewhere.
                let f = self.field_name();
                let i = pos(&mut self.rng, b);
                b.splice(i..i, format!("\"{f}\":").into_bytes());
            }
        }
    }

    fn field_name(&mut self) -> String {
        match self.rng.u8(0..10) {
            0 => self.string(12),
            1 => ["after_ok", "gpu", "Version", "cmd", "version "][self.rng.usize(..5)].into(),
            _ => SPEC_FIELDS[self.rng.usize(..SPEC_FIELDS.len())].into(),
        }
    }

    /// A random object over the known fields, valid JSON, so that inputs
    /// reach field validation (and are sometimes accepted).
    fn structured(&mut self) -> Vec<u8> {
        let mut obj = serde_json::Map::new();
        if self.rng.u8(0..10) != 0 {
            obj.insert("version".into(), Value::from(1));
        }
        if self.rng.u8(0..10) != 0 {
            obj.insert("command".into(), self.argv());
        }
        for _ in 0..self.rng.usize(0..5) {
            let f = self.field_name();
            let v = self.value_for(&f);
            obj.insert(f, v);
        }
        let mut s = Value::Object(obj).to_string();
        if self.rng.u8(0..8) == 0 {
            self.mutate_bytes_of(&mut s);
        }
        s.into_bytes()
    }

    fn mutate_bytes_of(&mut self, s: &mut String) {
        let mut b = std::mem::take(s).into_bytes();
        self.mutate(&mut b);
        *s = String::from_utf8_lossy(&b).into_owned();
    }

    fn argv(&mut self) -> Value {
        let n = self.rng.usize(0..4);
        let mut argv: Vec<Value> = (0..n).map(|_| Value::from(self.string(20))).collect();
        if n > 0 && self.rng.bool() {
            argv[0] = Value::from(["true", "/bin/sh", "python3"][self.rng.usize(..3)]);
        }
        Value::Array(argv)
    }

    fn value_for(&mut self, field: &str) -> Value {
        if self.rng.u8(0..4) == 0 {
            return self.any_value(2);
        }
        match field {
            "version" => Value::from(self.rng.i64(-1..3)),
            "id" | "user" => Value::from(self.name()),
            "command" => self.argv(),
            "workdir" => {
                let parts: Vec<String> = (0..self.rng.usize(0..4))
                    .map(|_| {
                        ["", ".", "..", "home", "a b", "é", "x"][self.rng.usize(..7)].to_string()
                    })
                    .collect();
                let lead = if self.rng.u8(0..5) == 0 { "" } else { "/" };
                Value::from(format!("{lead}{}", parts.join("/")))
            }
            "env" => {
                let mut m = serde_json::Map::new();
                for _ in 0..self.rng.usize(0..4) {
                    let k = match self.rng.u8(0..4) {
                        0 => self.string(10),
                        1 => [
                            "CUDA_VISIBLE_DEVICES",
                            "PTRAIN_JOB_ID",
                            "LD_PRELOAD",
                            "PATH",
                        ][self.rng.usize(..4)]
                        .into(),
                        _ => self.env_name(),
                    };
                    m.insert(k, Value::from(self.string(10)));
                }
                Value::Object(m)
            }
            "gpus" | "priority" => Value::from(self.rng.i64(-2..70)),
            "timeout" => match self.rng.u8(0..3) {
                0 => Value::from(self.rng.u64(0..40_000_000)),
                1 => Value::from(
                    ["90m", "1h30m", "0s", "1ns", "366days", "12", "soon", " 5m "]
                        [self.rng.usize(..8)],
                ),
                _ => Value::from(format!("{}s", self.rng.u32(..))),
            },
            _ => self.any_value(3),
        }
    }

    fn any_value(&mut self, depth: u32) -> Value {
        let pick = if depth == 0 {
            self.rng.u8(0..4)
        } else {
            self.rng.u8(0..6)
        };
        match pick {
            0 => Value::Null,
            1 => Value::from(self.rng.bool()),
            2 => match self.rng.u8(0..3) {
                0 => Value::from(self.rng.i64(..)),
                1 => Value::from(self.rng.u64(..)),
                _ => serde_json::Number::from_f64(self.rng.f64() * 1e6)
                    .map(Value::Number)
                    .unwrap_or(Value::Null),
            },
            3 => Value::from(self.string(16)),
            4 => Value::Array(
                (0..self.rng.usize(0..4))
                    .map(|_| self.any_value(depth - 1))
                    .collect(),
            ),
            _ => Value::Object(
                (0..self.rng.usize(0..4))
                    .map(|_| (self.string(8), self.any_value(depth - 1)))
                    .collect(),
            ),
        }
    }

    /// Deep or wide documents around the limits.
    fn nested(&mut self) -> Vec<u8> {
        match self.rng.u8(0..4) {
            0 => {
                let d = self.rng.usize(0..80);
                format!(
                    "{{\"version\":1,\"command\":[\"a\"],\"x\":{}1{}}}",
                    "[".repeat(d),
                    "]".repeat(d)
                )
                .into_bytes()
            }
            1 => {
                // A long path of long keys ending in a duplicate: the error
                // names where it is.
                let d = self.rng.usize(1..40);
                let key = self.string(120);
                let open: String = (0..d)
                    .map(|_| format!("{}:{{", Value::from(key.clone())))
                    .collect();
                format!(
                    "{{\"version\":1,\"command\":[\"a\"],{open}\"k\":1,\"k\":2{}}}",
                    "}".repeat(d)
                )
                .into_bytes()
            }
            2 => {
                let n = self.rng.usize(0..5000);
                format!(
                    "{{\"version\":1,\"command\":[{}]}}",
                    vec!["\"x\""; n].join(",")
                )
                .into_bytes()
            }
            _ => {
                let mut b = vec![b' '; MAX_SPEC_BYTES - 40 + self.rng.usize(0..80)];
                let doc = br#"{"version":1,"command":["a"]}"#;
                b[..doc.len()].copy_from_slice(doc);
                b
            }
        }
    }

    /// A string from an alphabet rich in the characters rules care about.
    pub fn string(&mut self, max: usize) -> String {
        const ALPHABET: &[char] = &[
            'a', 'Z', '0', '9', '.', '_', '-', '/', ' ', '\n', '\t', '\0', '$', '=', '"', '\\',
            'é', '\u{202e}', '\u{feff}', '\u{7f}', '😀', ':', '@', '*', '~', '#',
        ];
        let len = self.rng.usize(0..=max);
        (0..len)
            .map(|_| ALPHABET[self.rng.usize(..ALPHABET.len())])
            .collect()
    }

    fn env_name(&mut self) -> String {
        let len = self.rng.usize(1..12);
        let mut s: String = (0..len)
            .map(|_| *self.rng.choice(b"ABCXYZ_019az").unwrap() as char)
            .collect();
        if self.rng.u8(0..5) == 0 {
            s.insert_str(0, "PTRAIN_");
        }
        s
    }

    /// A name for the id and file-name checks: mostly near-valid, with
    /// lengths around the 64-byte limit.
    pub fn name(&mut self) -> String {
        let valid = b"abcXYZ0129._-";
        let len = match self.rng.u8(0..6) {
            0 => self.rng.usize(62..67),
            1 => self.rng.usize(0..300),
            _ => self.rng.usize(0..16),
        };
        let mut s: String = (0..len)
            .map(|_| *self.rng.choice(valid).unwrap() as char)
            .collect();
        if self.rng.u8(0..3) == 0 {
            let odd = self.string(3);
            let at = self.rng.usize(0..=s.len());
            s.insert_str(at, &odd);
        }
        match self.rng.u8(0..8) {
            0 => s.insert(0, '.'),
            1 => s.push_str(".json"),
            2 => s.push_str(".json~"),
            3 => s = format!("ptrain-job@{s}.service"),
            _ => {}
        }
        s
    }
}

/// How many inputs a run tries, from `PTRAIN_FUZZ_ITERS`.
fn iterations() -> u64 {
    std::env::var("PTRAIN_FUZZ_ITERS")
        .ok()
        .map(|v| v.parse().expect("PTRAIN_FUZZ_ITERS must be a number"))
        .unwrap_or(20_000)
}

/// The seed, from `PTRAIN_FUZZ_SEED` to replay a failure, else fresh.
fn seed() -> u64 {
    std::env::var("PTRAIN_FUZZ_SEED")
        .ok()
        .map(|v| v.parse().expect("PTRAIN_FUZZ_SEED must be a number"))
        .unwrap_or_else(|| fastrand::u64(..))
}

/// Runs `one` on generated inputs; returns how many it accepted.
fn run(what: &str, mut one: impl FnMut(&mut Gen) -> Result<bool, String>) -> (u64, u64) {
    let (iters, seed) = (iterations(), seed());
    let mut gen = Gen::new(seed);
    let mut accepted = 0;
    for i in 0..iters {
        match one(&mut gen) {
            Ok(ok) => accepted += u64::from(ok),
            Err(e) => panic!(
                "{what} failed at input {i} (replay: PTRAIN_FUZZ_SEED={seed} PTRAIN_FUZZ_ITERS={}):\n{e}",
                i + 1
            ),
        }
    }
    eprintln!("{what}: {iters} inputs, {accepted} accepted, PTRAIN_FUZZ_SEED={seed}");
    (iters, accepted)
}

/// A run that accepts (almost) nothing never reaches field validation and
/// the checks on accepted values: the generator would be broken.
fn assert_some_accepted(what: &str, (iters, accepted): (u64, u64)) {
    if iters >= 1000 {
        assert!(
            accepted * 100 >= iters && accepted * 100 <= iters * 90,
            "{what}: {accepted} of {iters} inputs accepted; the generator no longer reaches both sides"
        );
    }
}

#[test]
fn fuzz_parse_spec() {
    let counts = run("parse_spec", |gen| {
        let input = gen.descriptor();
        let default_id = gen.name();
        check_parse(&input, &default_id).map_err(|e| {
            format!(
                "{e}\ninput ({} bytes): {:?}\ndefault id: {default_id:?}",
                input.len(),
                String::from_utf8_lossy(&input[..input.len().min(600)])
            )
        })
    });
    assert_some_accepted("parse_spec", counts);
}

#[test]
fn fuzz_names() {
    let counts = run("names", |gen| {
        let name = if gen.rng.u8(0..4) == 0 {
            gen.string(70)
        } else {
            gen.name()
        };
        check_name(&name)
    });
    assert_some_accepted("names", counts);
}

/// The checks themselves must be able to fail: a few known answers.
#[test]
fn checks_know_right_from_wrong() {
    assert!(id_matches_regex("a"));
    assert!(id_matches_regex(&"a".repeat(64)));
    assert!(!id_matches_regex(&"a".repeat(65)));
    for bad in ["", ".a", "-a", "a/b", "a b", "é", "a\n", ".."] {
        assert!(!id_matches_regex(bad), "{bad:?}");
    }
    assert!(file_name_matches_regex("a.json"));
    assert!(!file_name_matches_regex(".json"));
    assert!(!file_name_matches_regex("a.json~"));
    assert!(check_message("t", "").is_err());
    assert!(check_message("t", "Upper").is_err());
    assert!(check_message("t", "two\nlines").is_err());
    assert!(check_message("t", &"x".repeat(MAX_MESSAGE_BYTES + 1)).is_err());
    assert!(check_message("t", "field `x` is wrong; fix it").is_ok());
    for seed in SEEDS {
        assert!(check_parse(seed.as_bytes(), "j").unwrap(), "{seed}");
    }
    assert!(check_name("train-1").unwrap());
    assert!(!check_name("../x.json").unwrap());
    assert!(!check_parse(b"{\"version\": 1}", "j").unwrap());
}
