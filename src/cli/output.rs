//! What every command shares: the runtime it drives the engine on, who it acts as,
//! and how it talks to a person or a script — tables with times a person reads,
//! `--json` lines, the typed-name confirmation, progress on stderr, and the one
//! mapping from an engine error to the operator's message.

use std::io::{BufRead, IsTerminal, Write};

use stategate::config::Config;
use stategate::error::Error;
use stategate::installation::{Installation, Purpose};

/// A single-threaded runtime for one command.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Who an operator command acts as, for version rows and the audit log:
/// `cli:<login name>` (a web UI or admin API operator is `operator:<email>`). The name
/// is `$USER`, else `$LOGNAME`, else the process's user in `/etc/passwd` (a service
/// account or a container has neither variable), else `uid-<n>` — never `unknown`.
pub fn operator() -> String {
    use std::os::unix::fs::MetadataExt;
    // The owner of /proc/self is the process's real user: no unsafe getuid call.
    let uid = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    cli_actor(
        std::env::var("USER").ok().as_deref(),
        std::env::var("LOGNAME").ok().as_deref(),
        &passwd,
        uid,
    )
}

/// The longest login name kept in an actor (POSIX allows 32; some systems more).
const MAX_LOGIN: usize = 64;

fn cli_actor(user: Option<&str>, logname: Option<&str>, passwd: &str, uid: Option<u32>) -> String {
    // A name from the environment is whatever the caller set: keep it printable and short.
    let clean = |name: &str| -> Option<String> {
        let name: String = name
            .trim()
            .chars()
            .filter(|c| !c.is_control())
            .take(MAX_LOGIN)
            .collect();
        (!name.is_empty()).then_some(name)
    };
    let from_passwd = || {
        let uid = uid?.to_string();
        passwd.lines().find_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            (fields.nth(1)? == uid).then(|| clean(name)).flatten()
        })
    };
    let name = user
        .and_then(clean)
        .or_else(|| logname.and_then(clean))
        .or_else(from_passwd)
        .or_else(|| uid.map(|u| format!("uid-{u}")))
        .unwrap_or_else(|| "uid-unknown".into());
    format!("cli:{name}")
}

/// The installation opened for `purpose` (`Installation::open`, as `serve` opens it),
/// and the runtime that drives its services for this command.
pub fn open(
    config: &Config,
    purpose: Purpose,
) -> anyhow::Result<(tokio::runtime::Runtime, Installation)> {
    let rt = runtime()?;
    let installation = rt.block_on(Installation::open(config, purpose))?;
    Ok((rt, installation))
}

/// The operator-facing message of an engine error (the detail a server would only log).
pub fn cli_error(e: Error) -> anyhow::Error {
    let frozen = match &e {
        Error::Locked { holder_info } => stategate::tofu::freeze::refusal(holder_info),
        _ => None,
    };
    if let Some(frozen) = frozen {
        return anyhow::anyhow!(
            "{} ({}); nothing was written. Wait for the freeze to end, or lift it with `stategate workspace unfreeze`",
            frozen.info,
            frozen.who
        );
    }
    match e {
        Error::Locked { holder_info } => anyhow::anyhow!(
            "the workspace is locked, nothing was written; wait for the run to finish (or force-unlock it). Lock holder: {}",
            String::from_utf8_lossy(&holder_info)
        ),
        Error::Internal { detail, .. } => anyhow::anyhow!("{detail}"),
        other => anyhow::anyhow!("{other}"),
    }
}

/// The error and its causes on one line ("outer: inner: root").
pub fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace('\n', " ")
}

/// One JSON object on one line of stdout: what `--json` prints.
pub fn json_line(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(value)?);
    Ok(())
}

/// [`json_line`] for each row.
pub fn json_lines<'a, T: serde::Serialize + 'a>(
    rows: impl IntoIterator<Item = &'a T>,
) -> anyhow::Result<()> {
    rows.into_iter().try_for_each(json_line)
}

/// A listing: JSON lines with `--json`, else a table (or `empty` on stderr when
/// there is nothing, so a script reading stdout sees nothing).
pub fn listing<T: serde::Serialize>(
    rows: &[T],
    json: bool,
    empty: &str,
    header: &[&str],
    cells: impl Fn(&T) -> Vec<String>,
) -> anyhow::Result<()> {
    if json {
        return json_lines(rows);
    }
    if rows.is_empty() {
        eprintln!("{empty}");
    } else {
        let cells: Vec<Vec<String>> = rows.iter().map(cells).collect();
        print!("{}", table(header, &cells));
    }
    Ok(())
}

/// Left-aligned columns, two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let mut out = line(&header);
    for row in rows {
        out.push_str(&line(row));
    }
    out
}

/// `45s`, `12m`, `3h`, `2d`.
pub fn age(seconds: i64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// An RFC 3339 time as a person reads it in a table: `2026-12-01 18:21 UTC` (the
/// exact instant stays in `--json`). Anything that is not a time is shown as it is.
pub fn when(rfc3339: &str) -> String {
    use time::format_description::well_known::Rfc3339;
    time::OffsetDateTime::parse(rfc3339, &Rfc3339)
        .ok()
        .and_then(|t| stategate::store::utc_minutes(t.unix_timestamp()))
        .unwrap_or_else(|| rfc3339.to_string())
}

/// [`when`] of an optional time, `-` when absent.
pub fn when_opt(rfc3339: Option<&str>) -> String {
    rfc3339.map_or_else(|| "-".to_string(), when)
}

/// Asks for `name` back before `action` (from a terminal or a pipe); anything else
/// aborts.
pub fn confirmed(name: &str, action: &str) -> anyhow::Result<bool> {
    if std::io::stdin().is_terminal() {
        eprint!("Type the workspace name ({name}) to {action}: ");
        std::io::stderr().flush()?;
    }
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(answer.trim() == name)
}

/// `1 resource`, `3 resources`.
pub fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A secret shown once: the token on stdout, the warning on stderr.
pub fn print_token(token: &str) {
    eprintln!("The token below is shown once and stored only as a hash. Keep it now:");
    println!("{token}");
}

/// A progress bar on stderr for long work; drawn only when stderr is a terminal
/// (indicatif hides it otherwise), so piped output stays clean.
pub fn progress_bar(what: &'static str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} blobs ({eta})")
    {
        bar.set_style(style);
    }
    bar.set_message(what);
    bar
}

/// A spinner for work without a count (a snapshot, a retention pass).
pub fn spinner(what: &'static str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(what);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// `progress(done, total)` for the engine, moving `bar`.
pub fn advance(bar: &indicatif::ProgressBar) -> impl Fn(usize, usize) + Sync + '_ {
    move |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_times_and_tables() {
        for (s, text) in [
            (5, "5s"),
            (119, "119s"),
            (120, "2m"),
            (7200, "2h"),
            (172_800, "2d"),
        ] {
            assert_eq!(age(s), text);
        }
        // (stored, shown)
        for (stored, shown) in [
            ("2026-12-01T18:21:07.123456789Z", "2026-12-01 18:21 UTC"),
            ("2026-12-01T20:21:07+02:00", "2026-12-01 18:21 UTC"),
            ("not a time", "not a time"),
        ] {
            assert_eq!(when(stored), shown);
        }
        assert_eq!(when_opt(None), "-");
        let text = table(
            &["A", "LONGER"],
            &[
                vec!["wide cell".into(), "x".into()],
                vec!["b".into(), "".into()],
            ],
        );
        assert_eq!(text, "A          LONGER\nwide cell  x\nb\n");
    }
}

#[cfg(test)]
mod actor_tests {
    use super::cli_actor;

    #[test]
    fn the_cli_actor_names_the_user_whatever_the_environment() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nops:x:1001:1001::/home/ops:/bin/sh\n";
        // (USER, LOGNAME, uid, actor)
        let table = [
            (Some("alice"), Some("bob"), Some(1001), "cli:alice"),
            (None, Some("bob"), Some(1001), "cli:bob"),
            (Some(""), Some("  "), Some(1001), "cli:ops"),
            (None, None, Some(0), "cli:root"),
            (None, None, Some(4242), "cli:uid-4242"),
            (None, None, None, "cli:uid-unknown"),
            (Some("a\u{1b}[31mb\n"), None, None, "cli:a[31mb"),
        ];
        for (user, logname, uid, want) in table {
            assert_eq!(
                cli_actor(user, logname, passwd, uid),
                want,
                "{user:?} {logname:?}"
            );
        }
        let long = "x".repeat(500);
        assert_eq!(cli_actor(Some(&long), None, passwd, None).len(), 4 + 64);
    }

    /// A freeze's refusal reads as a freeze (what, why, until when, what to do), a lock
    /// holder's as a lock: never the freeze's LockInfo as a "lock holder".
    #[test]
    fn a_freeze_refusal_is_not_a_lock_holder() {
        use super::{cli_error, one_line};
        use stategate::error::Error;
        let f = stategate::tofu::freeze::Freeze {
            workspace: "prod".into(),
            frozen_by: "cli:alice".into(),
            reason: "incident 42".into(),
            created_at: "2026-12-02T08:00:00Z".into(),
            until: None,
        };
        let frozen = one_line(&cli_error(Error::Locked {
            holder_info: f.lock_info().into(),
        }));
        assert_eq!(
            frozen,
            "workspace prod is frozen (until unfrozen): incident 42 (frozen by cli:alice); nothing was written. \
             Wait for the freeze to end, or lift it with `stategate workspace unfreeze`"
        );
        let locked = one_line(&cli_error(Error::Locked {
            holder_info: r#"{"ID":"L1","Operation":"OperationTypeApply","Who":"me@box"}"#.into(),
        }));
        assert!(locked.starts_with("the workspace is locked"), "{locked}");
    }
}
