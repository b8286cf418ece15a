//! The hidden `ptrain generate` (`make docs`): man pages and completions from
//! the clap definitions, and the job-id completion the static scripts cannot
//! know; the hidden `__complete-ids` it calls.

use std::path::{Path, PathBuf};

use ptrain::config::DEFAULT_CONFIG_PATH;
use ptrain::views::JobView;

use crate::{fail, from_bus, parse, proxy, Cli, Failure, EXIT_FAILURE};

/// How many recent ends `ptrain __complete-ids` offers besides the active
/// jobs: what `ptrain list` shows by default.
pub(crate) const COMPLETE_RECENT: u32 = 50;

/// The ids a job-id argument completes to: every listed job's, and each
/// sweep's once (status, stop and wait take them too), sorted.
pub(crate) fn completion_ids(jobs: &[JobView]) -> std::collections::BTreeSet<&str> {
    jobs.iter()
        .flat_map(|j| std::iter::once(j.id.as_str()).chain(j.group.as_deref()))
        .collect()
}

/// What the static completions clap_complete writes cannot know: job ids.
/// Each shell's script gets them from `ptrain __complete-ids` when the
/// argument being completed is a job id of `status`, `stop`, `logs` or
/// `wait`.
fn add_job_id_completion(path: &Path) -> std::io::Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let script = std::fs::read_to_string(path)?;
    let script = match name {
        "ptrain.bash" => format!("{script}{BASH_JOB_IDS}"),
        "ptrain.fish" => format!("{script}{FISH_JOB_IDS}"),
        "_ptrain" => {
            let call = "if [ \"$funcstack[1]\" = \"_ptrain\" ]; then";
            if !script.contains(call) || !script.contains("':id:_default'") {
                return Err(std::io::Error::other(
                    "clap_complete's zsh script changed shape; update add_job_id_completion",
                ));
            }
            script
                .replace("':id:_default'", "':id:_ptrain_job_ids'")
                .replace("'*::ids:_default'", "'*::ids:_ptrain_job_ids'")
                .replacen(call, &format!("{ZSH_JOB_IDS}{call}"), 1)
        }
        _ => return Ok(()),
    };
    std::fs::write(path, script)
}

/// Wraps clap's `_ptrain`: after the subcommand (skipping global options
/// and `--config`'s value), a word that is neither an option nor an
/// option's value is a job id.
const BASH_JOB_IDS: &str = r#"
# Job ids for status, stop, logs and wait, asked of ptraind.
_ptrain_with_job_ids() {
    _ptrain "$@"
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local word sub="" skip=0
    for word in "${COMP_WORDS[@]:1:COMP_CWORD-1}"; do
        if ((skip)); then skip=0; continue; fi
        case "$word" in
            --config) skip=1 ;;
            -*) ;;
            *) sub="$word"; break ;;
        esac
    done
    case "$sub" in status|stop|logs|wait) ;; *) return 0 ;; esac
    case "$cur" in -*) return 0 ;; esac
    case "$prev" in --config|--user|--lines|-n|--since) return 0 ;; esac
    COMPREPLY=($(compgen -W "$(ptrain __complete-ids 2>/dev/null)" -- "$cur"))
}
if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _ptrain_with_job_ids -o nosort -o bashdefault -o default ptrain
else
    complete -F _ptrain_with_job_ids -o bashdefault -o default ptrain
fi
"#;

const FISH_JOB_IDS: &str = r#"
# Job ids for status, stop, logs and wait, asked of ptraind.
complete -c ptrain -n "__fish_seen_subcommand_from status stop logs wait" -f -a "(ptrain __complete-ids 2>/dev/null)"
"#;

const ZSH_JOB_IDS: &str = r#"# Job ids for status, stop, logs and wait, asked of ptraind.
(( $+functions[_ptrain_job_ids] )) ||
_ptrain_job_ids() {
    local -a ids
    ids=(${(f)"$(ptrain __complete-ids 2>/dev/null)"})
    _describe -t job-ids 'job id' ids
}

"#;

pub(crate) fn generate(man: Option<PathBuf>, completions: Option<PathBuf>) -> Result<u8, Failure> {
    let io = |what: &str, dir: &Path, e: std::io::Error| {
        fail(
            EXIT_FAILURE,
            format!("cannot write {what} into {}: {e}", dir.display()),
        )
    };
    let cmd = <Cli as clap::CommandFactory>::command();
    if let Some(dir) = &man {
        let extra = ptrain::docgen::ManExtra {
            section: "1",
            files: &[
                (
                    DEFAULT_CONFIG_PATH,
                    "ptraind's configuration; ptrain reads spool_dir from it (or, when it cannot, asks ptraind).",
                ),
                (
                    "/var/spool/ptrain",
                    "The spool: ptrain submit drops job files here (mode 1733).",
                ),
            ],
            see_also: &["ptraind(8)", "systemctl(1)", "journalctl(1)"],
        };
        for path in ptrain::docgen::write_man_pages(cmd.clone(), &extra, dir)
            .map_err(|e| io("man pages", dir, e))?
        {
            outln!("{}", path.display());
        }
    }
    if let Some(dir) = &completions {
        for path in
            ptrain::docgen::write_completions(cmd, dir).map_err(|e| io("completions", dir, e))?
        {
            add_job_id_completion(&path).map_err(|e| io("completions", dir, e))?;
            outln!("{}", path.display());
        }
    }
    Ok(0)
}

/// The hidden `ptrain __complete-ids`: the ids a job-id argument
/// completes to, one a line.
pub(crate) async fn complete_ids() -> Result<u8, Failure> {
    let jobs: Vec<JobView> = parse(
        &proxy()
            .await?
            .list_recent(COMPLETE_RECENT)
            .await
            .map_err(from_bus)?,
    )?;
    for id in completion_ids(&jobs) {
        outln!("{id}");
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::list::tests::listed;

    #[test]
    fn completion_ids_name_each_job_and_each_sweep_once() {
        let mut member = listed("sw-lr1", 1000, "running", None);
        member.group = Some("sw".into());
        let mut other = listed("sw-lr2", 1000, "queued", None);
        other.group = Some("sw".into());
        let jobs = [listed("b", 1000, "failed", Some(1)), member, other];
        assert_eq!(
            completion_ids(&jobs).into_iter().collect::<Vec<_>>(),
            ["b", "sw", "sw-lr1", "sw-lr2"]
        );
    }

    /// Completes `words` (the last one being completed) with the generated
    /// bash script, `ptrain __complete-ids` answering `ids`.
    fn bash_completes(script: &Path, words: &[&str]) -> Vec<String> {
        let words: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        let program = format!(
            "source {script}
             ptrain() {{ [ \"$1\" = __complete-ids ] && printf 'alpha\\nbeta\\nsw\\n'; }}
             COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))
             _ptrain_with_job_ids ptrain \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script = script.display(),
            words = words.join(" ")
        );
        let out = std::process::Command::new("bash")
            .args(["--norc", "-c", &program])
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn bash_completes_job_ids_from_the_hidden_command() {
        let dir = tempfile::tempdir().unwrap();
        generate(None, Some(dir.path().to_owned())).unwrap();
        let bash = dir.path().join("ptrain.bash");
        let script = std::fs::read_to_string(&bash).unwrap();
        assert!(script.contains("ptrain __complete-ids"), "{script}");
        let generated = script.split("# Job ids for").next().unwrap();
        assert!(
            !generated.contains("__complete-ids") && !generated.contains("generate"),
            "hidden commands are not offered"
        );
        for words in [
            &["ptrain", "status", ""][..],
            &["ptrain", "stop", "alpha", ""],
            &["ptrain", "--config", "/etc/x.toml", "logs", ""],
            &["ptrain", "wait", ""],
        ] {
            assert_eq!(
                bash_completes(&bash, words),
                ["alpha", "beta", "sw"],
                "{words:?}"
            );
        }
        assert_eq!(bash_completes(&bash, &["ptrain", "status", "a"]), ["alpha"]);
        // Not a job id: an option, an option's value, another command.
        for words in [
            &["ptrain", "logs", "--since", ""][..],
            &["ptrain", "stop", "--user", ""],
            &["ptrain", "status", "--"],
        ] {
            let offered = bash_completes(&bash, words);
            assert!(
                !offered.contains(&"alpha".to_string()),
                "{words:?}: {offered:?}"
            );
        }
        let offered = bash_completes(&bash, &["ptrain", "list", ""]);
        assert!(!offered.contains(&"alpha".to_string()), "{offered:?}");

        let zsh = std::fs::read_to_string(dir.path().join("_ptrain")).unwrap();
        assert!(zsh.contains("_ptrain_job_ids() {") && zsh.contains("':id:_ptrain_job_ids'"));
        assert!(!zsh.contains("':id:_default'"), "{zsh}");
        let fish = std::fs::read_to_string(dir.path().join("ptrain.fish")).unwrap();
        assert!(
            fish.contains("(ptrain __complete-ids 2>/dev/null)"),
            "{fish}"
        );
    }
}
