//! Man pages (clap_mangen) and shell completions (clap_complete) generated
//! from the binaries' own clap definitions, so they never drift from
//! `--help`. Run by `make docs` through the hidden `ptrain generate` and
//! `ptraind generate` subcommands; the package ships the result.
//!
//! clap_mangen renders the generated sections; the `after_help` text
//! (examples, exit codes) is re-rendered here as preformatted EXAMPLES and
//! EXIT STATUS sections, since clap_mangen would fill its lines into one
//! paragraph, and FILES and SEE ALSO are added.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap_complete::Shell;

/// What a man page says beyond the clap definition.
pub struct ManExtra<'a> {
    /// "1" for user commands, "8" for daemons.
    pub section: &'a str,
    /// (path, what it is) for the FILES section.
    pub files: &'a [(&'a str, &'a str)],
    /// Pages for SEE ALSO, like "journalctl(1)".
    pub see_also: &'a [&'a str],
}

/// Writes `NAME.SECTION` for `cmd` and `NAME-SUB.SECTION` for each visible
/// subcommand (recursively) into `dir`; returns the files written.
pub fn write_man_pages(
    cmd: clap::Command,
    extra: &ManExtra,
    dir: &Path,
) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut cmd = cmd.disable_help_subcommand(true);
    // Gives subcommands their display names ("ptrain-submit").
    cmd.build();
    let root = cmd.get_name().to_owned();
    // Every page's footer names the package: "ptrain 0.1.0".
    let source = format!("{root} {}", cmd.get_version().unwrap_or_default());
    let mut written = Vec::new();
    let page = render_page(&cmd, extra, &source, None)?;
    written.push(write_file(
        dir,
        &format!("{root}.{}", extra.section),
        &page,
    )?);
    let mut stack: Vec<clap::Command> = visible_subcommands(&cmd);
    while let Some(sub) = stack.pop() {
        stack.extend(visible_subcommands(&sub));
        let name = sub.get_display_name().unwrap_or(sub.get_name()).to_owned();
        let page = render_page(&sub, extra, &source, Some(&root))?;
        written.push(write_file(
            dir,
            &format!("{name}.{}", extra.section),
            &page,
        )?);
    }
    written.sort();
    Ok(written)
}

fn visible_subcommands(cmd: &clap::Command) -> Vec<clap::Command> {
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect()
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, bytes)?;
    Ok(path)
}

/// One page; `parent` is the root command's name for a subcommand's page.
fn render_page(
    cmd: &clap::Command,
    extra: &ManExtra,
    source: &str,
    parent: Option<&str>,
) -> std::io::Result<Vec<u8>> {
    let mut man = clap_mangen::Man::new(cmd.clone())
        .section(extra.section)
        .source(source);
    if let Some(date) = source_date() {
        man = man.date(date);
    }
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut out)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut out)?;
    }
    if let Some(after) = cmd.get_after_long_help().or(cmd.get_after_help()) {
        let (examples, exit_status) = split_after_help(&after.to_string());
        if !examples.is_empty() {
            preformatted(&mut out, "EXAMPLES", &examples)?;
        }
        if let Some(text) = exit_status {
            preformatted(&mut out, "EXIT STATUS", &text)?;
        }
    }
    let files: &[(&str, &str)] = if parent.is_none() { extra.files } else { &[] };
    if !files.is_empty() {
        writeln!(out, ".SH FILES")?;
        for (path, what) in files {
            writeln!(out, ".TP\n.I {}\n{}", escape(path), escape(what))?;
        }
    }
    let mut see_also: Vec<String> = Vec::new();
    if let Some(parent) = parent {
        see_also.push(format!("{parent}({})", extra.section));
    }
    see_also.extend(extra.see_also.iter().map(|s| s.to_string()));
    if !see_also.is_empty() {
        writeln!(out, ".SH \"SEE ALSO\"")?;
        let refs: Vec<String> = see_also
            .iter()
            .map(|s| match s.split_once('(') {
                Some((name, section)) => format!(".BR {} ({}", escape(name), section),
                None => format!(".B {}", escape(s)),
            })
            .collect();
        // ".BR name (1)," on each line but the last.
        for (i, line) in refs.iter().enumerate() {
            let comma = if i + 1 < refs.len() { " ," } else { "" };
            writeln!(out, "{line}{comma}")?;
        }
    }
    if cmd.get_version().is_some() {
        man.render_version_section(&mut out)?;
    }
    Ok(out)
}

/// Splits `after_help` into examples and the exit codes paragraph (the
/// one starting "Exit codes"), each without the leading heading line.
pub fn split_after_help(text: &str) -> (String, Option<String>) {
    let paragraphs: Vec<&str> = text.split("\n\n").collect();
    let mut examples = Vec::new();
    let mut exit = None;
    for p in paragraphs {
        if p.trim_start().starts_with("Exit codes") && exit.is_none() {
            exit = Some(p.trim().to_owned());
        } else if !p.trim().is_empty() {
            let p = p.trim_end();
            let body = p.strip_prefix("Examples:\n").unwrap_or(p);
            examples.push(body.to_owned());
        }
    }
    (examples.join("\n\n"), exit)
}

fn preformatted(out: &mut Vec<u8>, heading: &str, text: &str) -> std::io::Result<()> {
    writeln!(out, ".SH \"{heading}\"\n.nf")?;
    for line in text.lines() {
        writeln!(out, "{}", escape(line))?;
    }
    writeln!(out, ".fi")
}

/// Roff-escapes running text: backslashes, hyphens (so options can be
/// copied), and a leading dot or quote that would read as a request.
pub fn escape(text: &str) -> String {
    let body = text.replace('\\', "\\e").replace('-', "\\-");
    if body.starts_with('.') || body.starts_with('\'') {
        format!("\\&{body}")
    } else {
        body
    }
}

/// `SOURCE_DATE_EPOCH` as YYYY-MM-DD, for reproducible pages.
fn source_date() -> Option<String> {
    let secs: u64 = std::env::var("SOURCE_DATE_EPOCH").ok()?.parse().ok()?;
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    Some(humantime::format_rfc3339(t).to_string()[..10].to_owned())
}

/// Writes bash (`NAME.bash`), zsh (`_NAME`) and fish (`NAME.fish`)
/// completions into `dir`; returns the files written.
pub fn write_completions(cmd: clap::Command, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let name = cmd.get_name().to_owned();
    let mut cmd = without_hidden(&cmd);
    [Shell::Bash, Shell::Zsh, Shell::Fish]
        .into_iter()
        .map(|shell| clap_complete::generate_to(shell, &mut cmd, &name, dir))
        .collect()
}

/// A copy of an unbuilt `cmd` without hidden subcommands and arguments:
/// the completion generators offer everything they are given.
fn without_hidden(cmd: &clap::Command) -> clap::Command {
    let mut out = clap::Command::new(cmd.get_name().to_owned())
        .about(cmd.get_about().cloned().unwrap_or_default())
        .visible_aliases(
            cmd.get_visible_aliases()
                .map(str::to_owned)
                .collect::<Vec<_>>(),
        );
    if let Some(version) = cmd.get_version() {
        out = out.version(version.to_owned());
    }
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        out = out.arg(arg.clone());
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        out = out.subcommand(without_hidden(sub));
    }
    out
}

/// The README, whose sections are the source of the file-format pages.
const README: &str = include_str!("../README.md");
/// The commented default config, every key with its default.
const DEFAULT_CONFIG: &str = include_str!("../packaging/ptrain.toml");

/// Writes the file-format pages, `ptrain-job.5` (the job file) and
/// `ptrain.toml.5` (the config), into `dir` from the README's sections on
/// them and the shipped default config, so the pages say what the README
/// says; returns the files written. `version` is the footer's ("ptrain
/// 0.1.0").
pub fn write_format_pages(dir: &Path, version: &str) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let job = readme_section("## The job file").unwrap_or_default();
    let config = readme_section("## Configuration").unwrap_or_default();
    let mut written = Vec::new();

    let mut page = title("PTRAIN-JOB", version);
    writeln!(
        page,
        ".SH NAME\nptrain\\-job \\- the JSON job file ptraind runs (descriptor version 1)"
    )?;
    writeln!(
        page,
        ".SH DESCRIPTION\nA user submits a job with\n.BR ptrain\\-submit (1)\n\
         or drops \\fINAME\\fR.json into the spool directory,\n.IR /var/spool/ptrain .\n\
         Its fields:"
    )?;
    markdown_to_roff(&mut page, &job);
    writeln!(
        page,
        ".SH FILES\n.TP\n.I /var/spool/ptrain\nThe spool (mode 1733).\n.TP\n\
         .I /usr/share/doc/ptrain/examples\nOne example file for each feature."
    )?;
    writeln!(
        page,
        ".SH \"SEE ALSO\"\n.BR ptrain (1) ,\n.BR ptrain\\-submit (1) ,\n.BR ptrain.toml (5) ,\n.BR ptraind (8)"
    )?;
    written.push(write_file(dir, "ptrain-job.5", &page)?);

    let mut page = title("PTRAIN.TOML", version);
    writeln!(
        page,
        ".SH NAME\nptrain.toml \\- the configuration of ptraind, the ptrain job launcher"
    )?;
    writeln!(page, ".SH DESCRIPTION")?;
    markdown_to_roff(&mut page, &config);
    writeln!(
        page,
        ".SH \"THE DEFAULT FILE\"\nAs shipped, every key commented with its default:"
    )?;
    writeln!(page, ".PP\n.nf")?;
    for line in DEFAULT_CONFIG.lines() {
        writeln!(page, "{}", escape(line))?;
    }
    writeln!(page, ".fi")?;
    writeln!(
        page,
        ".SH FILES\n.TP\n.I /etc/ptrain/ptrain.toml\nThe configuration (root only). \
         Check a change with \\fBptraind \\-\\-check\\-config\\fR, then \
         \\fBsystemctl restart ptraind\\fR."
    )?;
    writeln!(
        page,
        ".SH \"SEE ALSO\"\n.BR ptraind (8) ,\n.BR ptrain\\-job (5) ,\n.BR systemd.resource\\-control (5)"
    )?;
    written.push(write_file(dir, "ptrain.toml.5", &page)?);
    Ok(written)
}

fn title(name: &str, version: &str) -> Vec<u8> {
    let date = source_date().unwrap_or_default();
    format!(
        ".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n.TH {name} 5 \"{date}\" \"{}\" \"File Formats\"\n",
        escape(version)
    )
    .into_bytes()
}

/// The README's section whose heading starts with `heading`, without the
/// heading line, up to the next `## ` heading.
fn readme_section(heading: &str) -> Option<String> {
    let start = README.lines().position(|l| l.starts_with(heading))?;
    Some(
        README
            .lines()
            .skip(start + 1)
            .take_while(|l| !l.starts_with("## "))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// The README's markdown as roff: a `| a | b |` table becomes tagged
/// paragraphs (`.TP`), blank lines paragraphs, a fenced block a
/// preformatted one, `code` bold.
fn markdown_to_roff(out: &mut Vec<u8>, markdown: &str) {
    let mut fenced = false;
    let mut paragraph = true;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.extend_from_slice(if fenced { b".PP\n.nf\n" } else { b".fi\n" });
            continue;
        }
        if fenced {
            out.extend_from_slice(format!("{}\n", escape(line)).as_bytes());
            continue;
        }
        let trimmed = line.trim();
        if trimmed.is_empty() {
            paragraph = true;
            continue;
        }
        if let Some(row) = trimmed.strip_prefix('|') {
            let cells: Vec<&str> = split_table_row(row);
            // The header row and the |---| rule say nothing a tagged
            // paragraph does not.
            let rule = cells
                .iter()
                .all(|c| c.chars().all(|ch| ch == '-' || ch == ':'));
            if rule || cells.first().is_some_and(|c| *c == "field") {
                continue;
            }
            let (tag, rest) = cells
                .split_first()
                .map(|(t, r)| (*t, r.join(" ")))
                .unwrap_or_default();
            out.extend_from_slice(format!(".TP\n{}\n{}\n", inline(tag), inline(&rest)).as_bytes());
            paragraph = true;
            continue;
        }
        if paragraph {
            out.extend_from_slice(b".PP\n");
            paragraph = false;
        }
        out.extend_from_slice(format!("{}\n", inline(trimmed)).as_bytes());
    }
}

/// The cells of a table row after its leading `|`; a `|` inside backticks
/// belongs to the cell.
fn split_table_row(row: &str) -> Vec<&str> {
    let mut cells = Vec::new();
    let (mut start, mut in_code) = (0, false);
    for (i, c) in row.char_indices() {
        match c {
            '`' => in_code = !in_code,
            '|' if !in_code => {
                cells.push(row[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    let last = row[start..].trim();
    if !last.is_empty() {
        cells.push(last);
    }
    cells
}

/// One line of running text: escaped, `code` in bold; a line that would
/// start with a request character is guarded.
fn inline(text: &str) -> String {
    let mut out = String::new();
    for (i, piece) in text.split('`').enumerate() {
        let piece = escape(piece).trim_start_matches("\\&").to_owned();
        if i % 2 == 1 {
            out.push_str(&format!("\\fB{piece}\\fR"));
        } else {
            out.push_str(&piece);
        }
    }
    if out.starts_with('.') || out.starts_with('\'') {
        format!("\\&{out}")
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_pages_come_from_the_readme_and_the_default_config() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_format_pages(dir.path(), "ptrain 0.1.0").unwrap();
        assert_eq!(written.len(), 2);
        let job = std::fs::read_to_string(dir.path().join("ptrain-job.5")).unwrap();
        assert!(job.contains(".TH PTRAIN-JOB 5"), "{job}");
        // Every field of the README's table is a tagged paragraph.
        for field in ["version", "command", "gpus", "after_ok", "credentials"] {
            assert!(
                job.contains(&format!(".TP\n\\fB{}\\fR", escape(field))),
                "{field}: {job}"
            );
        }
        assert!(
            !job.contains("|---|") && !job.contains("| field |"),
            "{job}"
        );
        let config = std::fs::read_to_string(dir.path().join("ptrain.toml.5")).unwrap();
        assert!(config.contains(".TH PTRAIN.TOML 5"), "{config}");
        assert!(config.contains("max_queued_per_user = 1000"), "{config}");
        assert!(config.contains("\\-\\-check\\-config"), "{config}");
        // No line of running text reads as a roff request.
        for page in [&job, &config] {
            for line in page.lines() {
                if let Some(rest) = line.strip_prefix('.') {
                    let request = rest.split_whitespace().next().unwrap_or("");
                    assert!(
                        [
                            "TH", "SH", "SS", "PP", "TP", "nf", "fi", "B", "BR", "I", "IR", "ie",
                            "el"
                        ]
                        .contains(&request),
                        "{line:?} in {page}"
                    );
                }
            }
        }
    }

    #[test]
    fn table_rows_keep_pipes_inside_code() {
        assert_eq!(
            split_table_row(" `a` | b `x | y` c |"),
            ["`a`", "b `x | y` c"]
        );
    }

    fn demo() -> clap::Command {
        clap::Command::new("demo")
            .version("1.2.3")
            .about("Does things")
            .after_help(
                "Examples:\n  demo run .hidden    run it\n  demo -x a\\b\n\nExit codes: 0 fine,\n3 not fine.",
            )
            .arg(clap::Arg::new("config").long("config").help("The config"))
            .subcommand(clap::Command::new("run").about("Runs"))
            .subcommand(
                clap::Command::new("queue")
                    .about("The queue")
                    .subcommand(clap::Command::new("flush").about("Empties it")),
            )
            .subcommand(clap::Command::new("generate").hide(true))
    }

    #[test]
    fn splits_examples_from_exit_codes() {
        let (examples, exit) =
            split_after_help("Examples:\n  a   does a\n  b\n\nExit codes: 0 ok,\n1 not.");
        assert_eq!(examples, "  a   does a\n  b");
        assert_eq!(exit.as_deref(), Some("Exit codes: 0 ok,\n1 not."));
        let (examples, exit) = split_after_help("Examples:\n  x");
        assert_eq!((examples.as_str(), exit), ("  x", None));
    }

    #[test]
    fn escapes_roff() {
        assert_eq!(escape("--json"), "\\-\\-json");
        assert_eq!(escape(".hidden"), "\\&.hidden");
        assert_eq!(escape("a\\b"), "a\\eb");
    }

    #[test]
    fn pages_for_each_visible_subcommand_with_extra_sections() {
        let dir = tempfile::tempdir().unwrap();
        let extra = ManExtra {
            section: "1",
            files: &[("/etc/demo.toml", "The config.")],
            see_also: &["journalctl(1)"],
        };
        let written = write_man_pages(demo(), &extra, dir.path()).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["demo-queue-flush.1", "demo-queue.1", "demo-run.1", "demo.1"],
            "hidden subcommands get no page"
        );
        let root = std::fs::read_to_string(dir.path().join("demo.1")).unwrap();
        assert!(root.contains("\n.TH demo 1 "), "{root}");
        for section in [".SH NAME", ".SH SYNOPSIS", ".SH OPTIONS", ".SH SUBCOMMANDS"] {
            assert!(root.contains(section), "{section} in {root}");
        }
        assert!(
            root.contains(".SH \"EXAMPLES\"\n.nf\n  demo run .hidden    run it\n"),
            "{root}"
        );
        assert!(
            root.contains(".SH \"EXIT STATUS\"\n.nf\nExit codes: 0 fine,\n3 not fine.\n.fi"),
            "{root}"
        );
        assert!(root.contains("demo \\-x a\\eb"), "{root}");
        assert!(
            root.contains(".SH FILES\n.TP\n.I /etc/demo.toml\nThe config."),
            "{root}"
        );
        assert!(
            root.contains(".SH \"SEE ALSO\"\n.BR journalctl (1)\n"),
            "{root}"
        );
        assert!(
            !root.contains("generate"),
            "hidden subcommand listed: {root}"
        );
        let sub = std::fs::read_to_string(dir.path().join("demo-run.1")).unwrap();
        // The date field is empty, or SOURCE_DATE_EPOCH's day under make.
        let th = sub
            .lines()
            .find(|l| l.starts_with(".TH demo-run 1 "))
            .unwrap_or("");
        assert!(th.trim_end().ends_with(" \"demo 1.2.3\""), "{sub}");
        assert!(
            sub.contains(".BR demo (1) ,\n.BR journalctl (1)\n"),
            "{sub}"
        );
        assert!(!sub.contains(".SH FILES"), "{sub}");
    }

    #[test]
    fn completions_for_three_shells_without_hidden_commands() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_completions(demo(), dir.path()).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["demo.bash", "_demo", "demo.fish"]);
        let bash = std::fs::read_to_string(dir.path().join("demo.bash")).unwrap();
        assert!(
            bash.contains("queue") && bash.contains("--config"),
            "{bash}"
        );
        let fish = std::fs::read_to_string(dir.path().join("demo.fish")).unwrap();
        assert!(!fish.contains("generate"), "{fish}");
        let bash_and_zsh = bash + &std::fs::read_to_string(dir.path().join("_demo")).unwrap();
        assert!(!bash_and_zsh.contains("generate"), "{bash_and_zsh}");
    }
}
