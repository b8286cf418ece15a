//! The crate's module graph, checked from its sources (issue 19): no import
//! cycle between modules beyond the ones listed below, and the pure core
//! importing no I/O module. Also from the sources: every log entry that
//! names a job carries `PTRAIN_JOB`, the journal field `journalctl
//! PTRAIN_JOB=ID` (and the README) use to tell a job's whole story; an
//! entry with only `job = …` is stored as `JOB=` and missed.
//!
//! The graph is read from `src/**/*.rs` (not `lib.rs` or the binaries):
//! every `use crate::…` tree and every inline `crate::a::b` path outside
//! comments and `#[cfg(test)] mod … { }` blocks (a test may import what the
//! code does not). A node is a top-level module; `logs::*` and
//! `notifications::*` count as their parent. An edge `a -> b` says some file
//! of `a` names something of `b`. A name reached only through `super::` or
//! a module imported whole (`use crate::x;` then `x::Y`) is seen as an edge
//! to `x`, not as the item `Y`.
//!
//! The check is a ratchet: [`KNOWN_CYCLE_EDGES`] and [`KNOWN_IMPURE`] hold
//! today's debts; a new one fails, and so does an entry that is paid off
//! and not removed, so the lists only shrink.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

/// Edges that lie on an import cycle today. Every edge between two modules
/// of one cycle (one strongly connected component) must be listed here;
/// an edge listed here that no longer lies on a cycle must be removed.
const KNOWN_CYCLE_EDGES: &[(&str, &str)] = &[];

/// The pure core: modules that take values and `now` and do no I/O, so
/// they must not name an I/O module or an I/O item of a mixed one.
const PURE: &[&str] = &[
    "chain",
    "job",
    "kept_units",
    "policy",
    "resources",
    "scheduler",
    "setting",
    "spec",
    "unit",
    "views",
];

/// Pure rooms inside an I/O module: held to the pure core's rule file by
/// file (the daemon's admission rules take values, the daemon does the
/// I/O around them).
const PURE_FILES: &[&str] = &[
    "src/cdi/elf.rs",
    "src/cdi/hooks.rs",
    "src/cdi/registry.rs",
    "src/cdi/spec.rs",
    "src/cdi/translate.rs",
    "src/daemon/admission.rs",
    "src/daemon/lifecycle.rs",
    "src/daemon/live.rs",
    "src/daemon/planning.rs",
    "src/images/catalog.rs",
    "src/images/manifest.rs",
    "src/images/reference.rs",
    "src/images/settings.rs",
    "src/slurm/batch.rs",
];

/// What the pure core must not name: a path equal to or under one of
/// these. Whole modules that do I/O, and the I/O items of the mixed
/// modules (`store`'s records are pure, its `Store` is not; `gpu`'s
/// snapshot and choice are pure, NVML is not; `runtime`'s launch file is a
/// value, its preparation writes files; `users::Owner` is a value, looking
/// one up reads the user database).
const IO: &[&str] = &[
    "accounting::db",
    "accounting::helper",
    "accounting::usage::collect",
    "accounting::usage::write",
    "api",
    "board",
    "cdi::load",
    "config::load",
    "daemon",
    "fsutil",
    "gpu::NvmlInventory",
    "gpu::PoolMonitor",
    "gpu::open_inventory",
    "history",
    "images::BlobStore",
    "images::ImageStore",
    "images::archive",
    "images::auth",
    "images::assemble",
    "images::blobs",
    "images::registry",
    "images::runtime_root",
    "images::store",
    "images::unpack",
    "logs",
    "memory",
    "metrics",
    "notifications::Notifier",
    "notifications::NotifyError",
    "notifications::RetryTarget",
    "notifications::outbox",
    "notifications::sender",
    "notifications::tail",
    "notifications::transport",
    "requests",
    "runtime::JobRuntime",
    "runtime::exec_job",
    "spool",
    "store::QuarantineIndex",
    "store::Store",
    "store::record_exit",
    "systemd",
    "users::gid_of_group",
    "users::owner_of_uid",
];

/// Modules with both pure and I/O items: the pure core names their items
/// one by one (never the module whole), so [`IO`] can tell them apart.
const MIXED: &[&str] = &[
    "accounting",
    "cdi",
    "config",
    "gpu",
    "images",
    "notifications",
    "runtime",
    "store",
    "users",
];

/// Names of I/O items the pure core still uses today, as (module, path).
const KNOWN_IMPURE: &[(&str, &str)] = &[];

/// One source file: its top-level module and the crate paths it names.
struct Source {
    file: String,
    module: String,
    paths: Vec<Vec<String>>,
}

fn sources() -> Vec<Source> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel == "lib.rs" || rel.starts_with("bin/") {
            continue;
        }
        let first = rel.split('/').next().unwrap();
        let module = first.strip_suffix(".rs").unwrap_or(first).to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        out.push(Source {
            file: format!("src/{rel}"),
            module,
            paths: crate_paths(&strip(&text)),
        });
    }
    out
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code without comments and without `#[cfg(test)]` modules (which
/// this crate writes at column 0 and closes with a `}` at column 0).
fn strip(text: &str) -> String {
    let mut out = String::new();
    let mut in_test = false;
    let mut cfg_test = false;
    for line in text.lines() {
        if in_test {
            in_test = line != "}";
            continue;
        }
        let trimmed = line.trim_start();
        // `mod tests {`, or one the crate's other tests share
        // (`pub(crate) mod tests {`), at column 0.
        let decl = line
            .strip_prefix("pub(crate) ")
            .or_else(|| line.strip_prefix("pub "))
            .unwrap_or(line);
        if cfg_test && decl.starts_with("mod ") && decl.ends_with('{') {
            in_test = true;
            cfg_test = false;
            continue;
        }
        cfg_test = trimmed == "#[cfg(test)]" || (cfg_test && trimmed.starts_with("#["));
        if trimmed.starts_with("//") {
            continue;
        }
        // A trailing comment: `//` after code, outside a string literal
        // (an even number of quotes before it).
        let code = match line
            .match_indices("//")
            .find(|(i, _)| line[..*i].matches('"').count() % 2 == 0 && !line[..*i].ends_with(':'))
        {
            Some((i, _)) => &line[..i],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every `crate::` path in the code: `use` trees expanded, inline paths
/// read up to their last `::`-joined identifier.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = &rest[..at];
        let after = &rest[at + "crate::".len()..];
        if before.ends_with(|c: char| is_ident(c) || c == '$') {
            rest = after;
            continue;
        }
        if before.trim_end().ends_with("use") {
            let end = after.find(';').unwrap_or(after.len());
            expand(&[], after[..end].trim(), &mut paths);
            rest = &after[end..];
        } else {
            let mut segs = Vec::new();
            let mut s = after;
            loop {
                let n = s.find(|c: char| !is_ident(c)).unwrap_or(s.len());
                if n == 0 {
                    break;
                }
                segs.push(s[..n].to_string());
                s = &s[n..];
                match s.strip_prefix("::") {
                    Some(t) if t.starts_with(is_ident) => s = t,
                    Some(t) if t.starts_with('{') => {
                        let end = t.find(';').unwrap_or(t.len());
                        expand(&segs, &t[..end], &mut paths);
                        segs.clear();
                        break;
                    }
                    _ => break,
                }
            }
            if !segs.is_empty() {
                paths.push(segs);
            }
            rest = s;
        }
    }
    paths
}

/// Expand a use tree (`a::{b, c::{d, self}, e as f}`) under `prefix`.
fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if let Some(inner) = tree.strip_prefix('{') {
        let inner = inner.strip_suffix('}').unwrap_or(inner);
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(prefix, &inner[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand(prefix, &inner[start..], out);
        return;
    }
    if tree.is_empty() {
        return;
    }
    let (head, tail) = match tree.find("::") {
        Some(i) => (&tree[..i], Some(&tree[i + 2..])),
        None => (tree, None),
    };
    let head = head.split_whitespace().next().unwrap_or("");
    let mut path = prefix.to_vec();
    if head != "self" && head != "*" {
        path.push(head.to_string());
    }
    match tail {
        Some(t) => expand(&path, t, out),
        None => out.push(path),
    }
}

struct Graph {
    modules: BTreeSet<String>,
    /// a -> b, with a file of `a` that names `b`.
    edges: BTreeMap<String, BTreeMap<String, String>>,
}

fn graph(sources: &[Source]) -> Graph {
    let modules: BTreeSet<String> = sources.iter().map(|s| s.module.clone()).collect();
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for s in sources {
        for p in &s.paths {
            let to = &p[0];
            if modules.contains(to) && *to != s.module {
                edges
                    .entry(s.module.clone())
                    .or_default()
                    .entry(to.clone())
                    .or_insert_with(|| s.file.clone());
            }
        }
    }
    Graph { modules, edges }
}

/// The strongly connected component of each module (Tarjan).
fn components(g: &Graph) -> BTreeMap<String, usize> {
    struct T<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        comp: BTreeMap<String, usize>,
        next: usize,
        ncomp: usize,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        if let Some(out) = t.g.edges.get(v) {
            for w in out.keys() {
                let w = w.as_str();
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let l = t.low[w].min(t.low[v]);
                    t.low.insert(v, l);
                } else if t.stack.contains(&w) {
                    let l = t.index[w].min(t.low[v]);
                    t.low.insert(v, l);
                }
            }
        }
        if t.low[v] == t.index[v] {
            loop {
                let w = t.stack.pop().unwrap();
                t.comp.insert(w.to_string(), t.ncomp);
                if w == v {
                    break;
                }
            }
            t.ncomp += 1;
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        comp: BTreeMap::new(),
        next: 0,
        ncomp: 0,
    };
    for m in &g.modules {
        if !t.index.contains_key(m.as_str()) {
            visit(&mut t, m);
        }
    }
    t.comp
}

/// A shortest path `from -> … -> to` in the graph, for the message.
fn path(g: &Graph, from: &str, to: &str) -> Vec<String> {
    let mut prev: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = VecDeque::from([from.to_string()]);
    while let Some(v) = queue.pop_front() {
        if v == to {
            let mut p = vec![v.clone()];
            let mut at = v;
            while let Some(u) = prev.get(&at) {
                p.push(u.clone());
                at = u.clone();
            }
            p.reverse();
            return p;
        }
        for w in g.edges.get(&v).into_iter().flat_map(|o| o.keys()) {
            if w != from && !prev.contains_key(w) {
                prev.insert(w.clone(), v.clone());
                queue.push_back(w.clone());
            }
        }
    }
    Vec::new()
}

/// What is wrong with `g` against the `known` cycle edges: each edge on a
/// cycle that is not known (with the cycle), each known one that is not.
fn cycle_problems(g: &Graph, known: &[(&str, &str)]) -> Vec<String> {
    let comp = components(g);
    let known: BTreeSet<(&str, &str)> = known.iter().copied().collect();
    let mut on_cycle = BTreeSet::new();
    let mut problems = Vec::new();
    for (a, out) in &g.edges {
        for (b, file) in out {
            if comp[a] != comp[b] {
                continue;
            }
            on_cycle.insert((a.as_str(), b.as_str()));
            if !known.contains(&(a.as_str(), b.as_str())) {
                let mut cycle = path(g, b, a);
                cycle.insert(0, a.clone());
                problems.push(format!(
                    "new import cycle {} (the edge {a} -> {b} is in {file})",
                    cycle.join(" -> ")
                ));
            }
        }
    }
    for (a, b) in &known {
        if !on_cycle.contains(&(*a, *b)) {
            problems.push(format!(
                "{a} -> {b} no longer lies on an import cycle: remove it from KNOWN_CYCLE_EDGES"
            ));
        }
    }
    problems
}

#[test]
fn no_new_import_cycle() {
    let problems = cycle_problems(&graph(&sources()), KNOWN_CYCLE_EDGES);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_cycle_check_fails_on_a_new_cycle_and_on_a_stale_entry() {
    let g = |edges: &[(&str, &str)]| {
        let mut graph = Graph {
            modules: BTreeSet::new(),
            edges: BTreeMap::new(),
        };
        for (a, b) in edges {
            graph.modules.insert(a.to_string());
            graph.modules.insert(b.to_string());
            graph
                .edges
                .entry(a.to_string())
                .or_default()
                .insert(b.to_string(), format!("src/{a}.rs"));
        }
        graph
    };
    let known = [("a", "b"), ("b", "a")];
    assert!(cycle_problems(&g(&[("a", "b"), ("b", "a"), ("c", "a")]), &known).is_empty());
    // c joins the cycle: a new one, named with its path.
    let p = cycle_problems(
        &g(&[("a", "b"), ("b", "a"), ("a", "c"), ("c", "a")]),
        &known,
    );
    assert_eq!(
        p,
        [
            "new import cycle a -> c -> a (the edge a -> c is in src/a.rs)",
            "new import cycle c -> a -> c (the edge c -> a is in src/c.rs)"
        ]
    );
    // The cycle broken: its entries must go.
    let p = cycle_problems(&g(&[("a", "b")]), &known);
    assert_eq!(
        p,
        [
            "a -> b no longer lies on an import cycle: remove it from KNOWN_CYCLE_EDGES",
            "b -> a no longer lies on an import cycle: remove it from KNOWN_CYCLE_EDGES"
        ]
    );
}

#[test]
fn pure_core_names_no_io() {
    let sources = sources();
    let modules: BTreeSet<&str> = sources.iter().map(|s| s.module.as_str()).collect();
    for m in PURE {
        assert!(
            modules.contains(m),
            "PURE names {m}, which is not a module of src/"
        );
    }
    for f in PURE_FILES {
        assert!(
            sources.iter().any(|s| s.file == *f),
            "PURE_FILES names {f}, which is not a file of src/"
        );
    }
    let known: BTreeSet<(&str, &str)> = KNOWN_IMPURE.iter().copied().collect();
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    let pure =
        |s: &&Source| PURE.contains(&s.module.as_str()) || PURE_FILES.contains(&s.file.as_str());
    for s in sources.iter().filter(pure) {
        for p in &s.paths {
            let joined = p.join("::");
            if p.len() == 1 && MIXED.contains(&p[0].as_str()) {
                problems.push(format!(
                    "{} names the mixed module {joined} whole: import its items by name",
                    s.file
                ));
                continue;
            }
            let Some(io) = IO
                .iter()
                .find(|io| joined == **io || joined.starts_with(&format!("{io}::")))
            else {
                continue;
            };
            if known.contains(&(s.module.as_str(), joined.as_str())) {
                seen.insert((s.module.as_str(), joined.clone()));
            } else {
                problems.push(format!(
                    "{} (pure core) names {joined}, which is I/O ({io})",
                    s.file
                ));
            }
        }
    }
    for (m, p) in &known {
        if !seen.contains(&(*m, p.to_string())) {
            problems.push(format!(
                "{m} no longer names {p}: remove it from KNOWN_IMPURE"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_reader_sees_use_trees_and_inline_paths() {
    let code = strip(
        "use crate::{now_micros, logs::journal::{self, RunFilter}, store::JobRecord as R};\n\
         // crate::daemon in a comment\n\
         let x = crate::spec::parse_spec(b); // crate::api\n\
         pub(crate) fn f() {}\n\
         #[cfg(test)]\n\
         mod tests {\n    use crate::metrics;\n}\n\
         #[cfg(test)]\n\
         pub(crate) mod tests {\n    use crate::config;\n}\n",
    );
    let got: Vec<String> = crate_paths(&code).iter().map(|p| p.join("::")).collect();
    assert_eq!(
        got,
        [
            "now_micros",
            "logs::journal",
            "logs::journal::RunFilter",
            "store::JobRecord",
            "spec::parse_spec"
        ]
    );
}

/// The tracing macros whose calls are log entries.
const LOG_MACROS: &[&str] = &["error", "warn", "info", "debug", "trace", "event"];

/// The text of the call whose argument list opens at `open` (the `(`),
/// up to its balanced `)`; string and char literals are skipped.
fn call_text(text: &str, open: usize) -> &str {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'\'' if bytes.get(i + 2) == Some(&b'\'') => i += 2,
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return &text[open..=i];
                }
            }
            _ => {}
        }
        i += 1;
    }
    &text[open..]
}

/// Whether a call's text names the field `job` (`job = %x`, `job = ?x`,
/// `job=%x`), not a longer name ending in it.
fn names_job_field(call: &str) -> bool {
    call.match_indices("job").any(|(at, _)| {
        let before = call[..at].chars().next_back();
        let after = call[at + 3..].trim_start();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
            && after.starts_with('=')
            && !after.starts_with("==")
            && after[1..].trim_start().starts_with(['%', '?'])
    })
}

/// The tracing calls in `text` that name a job without `PTRAIN_JOB`, as the
/// line numbers where they start.
fn unlabelled(text: &str) -> Vec<usize> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices("!(") {
        let name_start = text[..at]
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        if !LOG_MACROS.contains(&&text[name_start..at]) {
            continue;
        }
        let call = call_text(text, at + 1);
        if names_job_field(call) && !call.contains("PTRAIN_JOB") {
            found.push(text[..at].lines().count());
        }
    }
    found
}

#[test]
fn every_log_entry_about_a_job_carries_ptrain_job() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&root, &mut files);
    assert!(files.len() > 20, "read the crate's sources");
    let mut missing = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in unlabelled(&text) {
            missing.push(format!("{}:{line}", file.display()));
        }
    }
    assert!(
        missing.is_empty(),
        "log entries naming a job without PTRAIN_JOB (add `PTRAIN_JOB = %id` beside `job = %id`): {missing:#?}"
    );
}

#[test]
fn the_check_sees_an_entry_without_the_field() {
    let bad = "fn f() {\n    warn!(job = %id, error = %e, \"cannot\");\n}\n";
    assert_eq!(unlabelled(bad), [2]);
    let good = "warn!(\n    job = %id,\n    PTRAIN_JOB = %id,\n    \"ok (really)\"\n);";
    assert!(unlabelled(good).is_empty());
    assert!(unlabelled("let s = format!(\"{}\", job = %x);").is_empty());
    // A match arm without `;`, before a call that has the field: still seen.
    let arm = "match r {\n    Err(e) => tracing::warn!(job = ?id, \"x\"),\n    Ok(_) => info!(job = %id, PTRAIN_JOB = %id, \"y\");\n}";
    assert_eq!(unlabelled(arm), [2]);
    // A nested macro before the field, and no spaces around `=`.
    assert_eq!(
        unlabelled("error!(why = %format!(\"(\"), job=%id, \"z\");"),
        [1]
    );
    // Other fields ending in `job`, and comparisons, are not the field.
    assert!(unlabelled("info!(parent_job = %p, \"a\"); debug!(\"{}\", job == x);").is_empty());
}
