//! `ptrain history` and `ptrain report`: ended runs and what they used,
//! from ptraind's accounting database (issue 23).

use crate::{fail, from_bus, parse, print_json, proxy, Failure, EXIT_USAGE};

/// The filters `history` and `report` share.
#[derive(clap::Args)]
pub(crate) struct AccountingFilter {
    /// Only the runs of USER (a login name or a uid); others than root see
    /// only their own.
    #[arg(long, value_name = "USER")]
    user: Option<String>,
    /// Only the runs of owners whose primary group is GROUP (a name or a
    /// gid).
    #[arg(long, value_name = "GROUP")]
    group: Option<String>,
    /// Runs that ended since then: a duration ago ("7d", "12h") or a UTC
    /// time ("2026-11-01", "2026-11-01 12:00:00").
    #[arg(long)]
    since: Option<String>,
    /// Runs that ended before then (same forms as --since).
    #[arg(long)]
    until: Option<String>,
    /// Only runs that ended so (repeat it or separate them by commas).
    #[arg(
        long,
        value_name = "STATUS",
        value_delimiter = ',',
        value_parser = clap::builder::PossibleValuesParser::new(ended_status_words())
    )]
    status: Vec<String>,
    /// Only jobs whose name or id matches PATTERN (a glob: * ? [..]).
    #[arg(long, value_name = "PATTERN")]
    name: Option<String>,
    /// Only runs that held exactly N GPUs.
    #[arg(long, value_name = "N")]
    gpus: Option<u32>,
}

#[derive(clap::Args)]
pub(crate) struct HistoryArgs {
    #[command(flatten)]
    filter: AccountingFilter,
    /// The columns, comma-separated (`--format help` lists them).
    #[arg(long, value_name = "COLUMNS", default_value = ptrain::accounting::query::DEFAULT_FORMAT)]
    format: String,
    /// The newest N runs that match (0: all of them).
    #[arg(long, short = 'n', default_value_t = 100)]
    limit: u32,
    /// Every field of each run, as a JSON array.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// The --format columns as CSV, with a header line.
    #[arg(long)]
    csv: bool,
}

#[derive(clap::Args)]
pub(crate) struct ReportArgs {
    #[command(flatten)]
    filter: AccountingFilter,
    /// Sum per user, per (primary) group, or per GPU (a run counts for each
    /// GPU it held).
    #[arg(long, value_parser = ["user", "group", "gpu"], default_value = "user")]
    by: String,
    /// Only the N lines with the most GPU-hours (0: all).
    #[arg(long, value_name = "N", default_value_t = 0)]
    top: u32,
    /// Each user's fair-share standing now instead (`[policy]
    /// fair_share`): decayed GPU-hours, share and factor; among jobs of
    /// equal priority, those of a higher factor start first.
    #[arg(long, conflicts_with_all = ["by", "top"])]
    fair_share: bool,
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    #[arg(long)]
    csv: bool,
}

/// The words an ended run's status can be.
fn ended_status_words() -> Vec<&'static str> {
    ptrain::job::Outcome::STATUSES
        .into_iter()
        .chain(["ended"])
        .collect()
}

impl AccountingFilter {
    fn query(self) -> Result<ptrain::accounting::query::HistoryQuery, Failure> {
        let now = ptrain::now_micros();
        let when = |flag: &str, text: Option<String>| {
            text.map(|t| {
                ptrain::logs::parse_since(&t, now)
                    .map_err(|e| fail(EXIT_USAGE, e.replacen("--since", flag, 1)))
            })
            .transpose()
        };
        let gid = match self.group {
            None => None,
            Some(g) => Some(match g.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => ptrain::users::gid_of_group(&g).ok_or_else(|| {
                    fail(
                        EXIT_USAGE,
                        format!("no group {g:?} on this system; give a group name (`getent group NAME`) or a gid"),
                    )
                })?,
            }),
        };
        Ok(ptrain::accounting::query::HistoryQuery {
            user: self.user,
            gid,
            since_us: when("--since", self.since)?,
            until_us: when("--until", self.until)?,
            statuses: self.status,
            name: self.name,
            gpus: self.gpus,
            limit: 0,
        })
    }
}

pub(crate) async fn history(args: HistoryArgs) -> Result<u8, Failure> {
    use ptrain::accounting::query::{self, HistoryRow, FORMAT_COLUMNS};
    if args.format == "help" {
        for (name, what) in FORMAT_COLUMNS {
            outln!("{name:<12} {what}");
        }
        return Ok(0);
    }
    let columns = query::parse_format(&args.format).map_err(|e| fail(EXIT_USAGE, e))?;
    let mut q = args.filter.query()?;
    q.limit = args.limit;
    let asked_user = q.user.is_some();
    let json = serde_json::to_string(&q).expect("a query always serialises");
    let rows: Vec<HistoryRow> = parse(&proxy().await?.history(&json).await.map_err(from_bus)?)?;
    if args.json {
        print_json(&rows);
        return Ok(0);
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| columns.iter().map(|c| query::cell(r, c)).collect())
        .collect();
    if args.csv {
        out!("{}", query::csv(&columns, &cells));
    } else if rows.is_empty() {
        let hint = match asked_user && !is_root() {
            true => " (users other than root see only their own runs)",
            false => "",
        };
        errln!("no ended run matches{hint}");
    } else {
        out!("{}", query::table(&columns, &cells));
    }
    Ok(0)
}

/// `ptrain report --fair-share`.
async fn fair_share(args: ReportArgs) -> Result<u8, Failure> {
    use ptrain::accounting::query;
    let view: ptrain::fair_share::FairShareView =
        parse(&proxy().await?.fair_share().await.map_err(from_bus)?)?;
    if args.json {
        print_json(&view);
        return Ok(0);
    }
    let header = [
        "user",
        "gid",
        "gpu_hours",
        "usage",
        "share",
        "effective",
        "factor",
    ];
    let cells: Vec<Vec<String>> = view
        .users
        .iter()
        .map(|s| {
            let user =
                ptrain::users::owner_of_uid(s.uid).map_or_else(|| s.uid.to_string(), |o| o.name);
            vec![
                user,
                s.gid.to_string(),
                format!("{:.3}", s.usage / 3600.0),
                format!("{:.4}", s.normalized_usage),
                format!("{:.4}", s.share),
                format!("{:.4}", s.effective_usage),
                format!("{:.4}", s.factor),
            ]
        })
        .collect();
    if args.csv {
        out!("{}", query::csv(&header, &cells));
        return Ok(0);
    }
    let half_life = humantime::format_duration(std::time::Duration::from_secs(view.half_life_secs));
    outln!("fair share: GPU use halves in weight every {half_life}; a higher factor starts first among equal priorities");
    if !view.read_back {
        outln!(
            "(the usage before ptraind's start is still being read from the accounting database)"
        );
    }
    if cells.is_empty() {
        errln!("nobody has used a GPU lately or waits for one");
    } else {
        out!("{}", query::table(&header, &cells));
    }
    Ok(0)
}

pub(crate) async fn report(args: ReportArgs) -> Result<u8, Failure> {
    use ptrain::accounting::query::{self, ReportBy, ReportQuery, ReportRow, REPORT_COLUMNS};
    if args.fair_share {
        return fair_share(args).await;
    }
    let by = match args.by.as_str() {
        "group" => ReportBy::Group,
        "gpu" => ReportBy::Gpu,
        _ => ReportBy::User,
    };
    let q = ReportQuery {
        filter: args.filter.query()?,
        by,
        top: args.top,
    };
    let json = serde_json::to_string(&q).expect("a query always serialises");
    let rows: Vec<ReportRow> = parse(&proxy().await?.report(&json).await.map_err(from_bus)?)?;
    if args.json {
        print_json(&rows);
        return Ok(0);
    }
    let mut header = REPORT_COLUMNS.to_vec();
    header[0] = match by {
        ReportBy::User => "user",
        ReportBy::Group => "gid",
        ReportBy::Gpu => "gpu",
    };
    let cells: Vec<Vec<String>> = rows.iter().map(query::report_cells).collect();
    if args.csv {
        out!("{}", query::csv(&header, &cells));
    } else if rows.is_empty() {
        errln!("no ended run in that period");
    } else {
        out!("{}", query::table(&header, &cells));
    }
    Ok(0)
}

fn is_root() -> bool {
    // SAFETY: geteuid never fails and touches no memory.
    unsafe { libc::geteuid() == 0 }
}
