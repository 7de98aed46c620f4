//! What every page shares, below the page modules (`pages`, `drift_pages`): the
//! signed-in chrome, the HTML layout around a page's body, and the formatting of
//! times, sizes and typed confirmations. It imports no page module, so the pages can
//! use it and each other without a circle.

use maud::{html, Markup, DOCTYPE};

use crate::operator::roles::{Action, Grant, Target};

/// What every signed-in page shows in its header, and the clock pages are rendered at.
pub struct Chrome<'a> {
    pub email: &'a str,
    pub csrf: &'a str,
    /// The operator's role and patterns: the header shows them, and pages offer only
    /// the actions they allow (the server refuses the others anyway, `http::guard`).
    pub grant: &'a Grant,
    pub now: i64,
}

impl Chrome<'_> {
    /// Is `action` on `workspace` offered on this page?
    pub fn may(&self, action: Action, workspace: &str) -> bool {
        self.grant.may(action, Target::Workspace(workspace))
    }

    /// The header's role: `viewer`, or `viewer (dev-*, stage)` when limited.
    fn role(&self) -> String {
        let role = self.grant.role.as_str();
        if self.grant.is_limited() {
            format!("{role} ({})", self.grant.workspaces().replace(',', ", "))
        } else {
            role.to_string()
        }
    }
}

const PAGE_TITLE_SUFFIX: &str = " · stategate";

pub fn layout(title: &str, chrome: Option<&Chrome>, body: Markup) -> Markup {
    layout_refreshing(title, chrome, None, body)
}

/// [`layout`] for a page that reloads itself every `refresh` seconds (a run still
/// going; the UI has no JavaScript).
pub fn layout_refreshing(
    title: &str,
    chrome: Option<&Chrome>,
    refresh: Option<u32>,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(seconds) = refresh { meta http-equiv="refresh" content=(seconds); }
                title { (title) (PAGE_TITLE_SUFFIX) }
                link rel="stylesheet" href="/ui/static/app.css";
                link rel="icon" href="/favicon.ico" type="image/x-icon";
            }
            body {
                header.top {
                    a.brand href="/ui/" { "stategate" }
                    @if let Some(c) = chrome {
                        nav {
                            a href="/ui/workspaces" { "Workspaces" }
                            a href="/ui/audit" { "Audit" }
                            @if c.grant.may(Action::Read, Target::Site) {
                                a href="/ui/clusters" { "Clusters" }
                            }
                            a href="/ui/drift" { "Drift" }
                            a href="/ui/search" { "Search" }
                            @if c.grant.may(Action::Administer, Target::Site) {
                                a href="/ui/workspace-tokens" { "Tokens" }
                                a href="/ui/keys" { "Keys" }
                            }
                        }
                        form method="post" action="/ui/logout" {
                            span.who { (c.email) }
                            " "
                            span.role title="your operator role" { (c.role()) }
                            input type="hidden" name="csrf" value=(c.csrf);
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

pub fn unix_seconds(rfc3339: &str) -> Option<i64> {
    time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp())
}

/// A signed age in words: `just now`, `42s ago`, `5 min ago`, `3 h ago`, `2 days ago`,
/// `3 months ago`; a time ahead of now reads `in 3 months` (a token's expiry, a
/// freeze's end). Up to a minute ahead is still `just now`: another node's clock may
/// run a little ahead of this one.
pub fn ago(seconds: i64) -> String {
    match seconds {
        s if s < -60 => format!("in {}", span(s.saturating_neg())),
        s if s < 1 => "just now".into(),
        s => format!("{} ago", span(s)),
    }
}

/// A positive duration in the largest unit that still reads as a whole number.
fn span(s: i64) -> String {
    const DAY: i64 = 86_400;
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{} min", s / 60),
        s if s < 2 * DAY => format!("{} h", s / 3600),
        s if s < 60 * DAY => format!("{} days", s / DAY),
        s if s < 730 * DAY => format!("{} months", s / (30 * DAY)),
        s => format!("{} years", s / (365 * DAY)),
    }
}

/// `2026-12-01T21:03:07Z` and `2026-12-01 21:03 UTC` of a unix time (no fractions).
pub fn utc(unix: i64) -> Option<(String, String)> {
    let t = time::OffsetDateTime::from_unix_timestamp(unix).ok()?;
    let iso = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    Some((t.format(&iso).ok()?, crate::store::utc_minutes(unix)?))
}

/// A time as `2026-12-01 21:03 UTC · 2 min ago`: absolute (UTC, no fractions, also
/// in `datetime`) beside relative, readable on a phone without hovering.
pub fn when(rfc3339: &str, now: i64) -> Markup {
    match unix_seconds(rfc3339).and_then(|t| Some((t, utc(t)?))) {
        Some((t, (iso, shown))) => html! {
            time datetime=(iso) { span.abs { (shown) } " · " (ago(now - t)) }
        },
        None => html! { span.muted { (rfc3339) } },
    }
}

/// [`when`] of a Unix time; `–` for none.
pub fn unix_when(at: Option<i64>, now: i64) -> Markup {
    let text = at
        .and_then(|t| time::OffsetDateTime::from_unix_timestamp(t).ok())
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        });
    match text {
        Some(t) => when(&t, now),
        None => html! { "–" },
    }
}

/// `812 B`, `4.2 KiB`, `1.5 MiB`.
pub fn size(bytes: i64) -> String {
    match bytes {
        b if b < 1024 => format!("{b} B"),
        b if b < 1024 * 1024 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)),
    }
}

pub fn dash<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "–".into(), |v| v.to_string())
}

/// A regex matching exactly `text` (the `pattern` of a typed confirmation). Only
/// syntax characters are escaped: browsers compile `pattern` in Unicode mode, where
/// any other escape (`\-`) makes the whole pattern invalid and ignored.
pub fn exact_pattern(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escape = r"^$\.*+?()[]{}|/".contains(c);
            escape.then_some('\\').into_iter().chain(std::iter::once(c))
        })
        .collect()
}

/// A file path (or any `/`-separated text) that may wrap after each `/` (a `wbr`) and,
/// through the `path` class, inside a part only when that part alone is wider than the
/// line: a long data dir on a phone wraps at its slashes, not mid-name, and never
/// makes the page scroll sideways.
pub fn breakable_path(text: &str) -> Markup {
    html! { span.path { @for part in text.split_inclusive('/') { (part) wbr; } } }
}

pub fn ws_href(workspace: &str) -> String {
    format!("/ui/workspaces/{workspace}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_wraps_after_its_slashes_and_is_escaped() {
        for (text, html) in [
            (
                "/var/lib/dek",
                r#"<span class="path">/<wbr>var/<wbr>lib/<wbr>dek<wbr></span>"#,
            ),
            (
                "file <x>",
                r#"<span class="path">file &lt;x&gt;<wbr></span>"#,
            ),
            ("", r#"<span class="path"></span>"#),
        ] {
            assert_eq!(breakable_path(text).into_string(), html, "{text}");
        }
    }

    #[test]
    fn relative_times_and_sizes() {
        let table = [
            (0, "just now"),
            (-30, "just now"),
            (-61, "in 61s"),
            (-90 * 86400, "in 3 months"),
            (-400 * 86400, "in 13 months"),
            (-3 * 365 * 86400, "in 3 years"),
            (i64::MIN, "in 292471208677 years"),
            (90 * 86400, "3 months ago"),
            (2, "2s ago"),
            (42, "42s ago"),
            (300, "5 min ago"),
            (3 * 3600, "3 h ago"),
            (5 * 86400, "5 days ago"),
        ];
        for (s, want) in table {
            assert_eq!(ago(s), want, "{s}");
        }
        for (b, want) in [(812, "812 B"), (4300, "4.2 KiB"), (1572864, "1.5 MiB")] {
            assert_eq!(size(b), want);
        }
    }

    #[test]
    fn times_show_utc_beside_relative_without_fractions() {
        let now = unix_seconds("2026-12-01T21:05:07Z").unwrap();
        let table = [
            (
                "2026-12-01T21:03:07.123456789Z",
                r#"<time datetime="2026-12-01T21:03:07Z"><span class="abs">2026-12-01 21:03 UTC</span> · 2 min ago</time>"#,
            ),
            (
                "2026-12-01T23:03:07+02:00",
                r#"<time datetime="2026-12-01T21:03:07Z"><span class="abs">2026-12-01 21:03 UTC</span> · 2 min ago</time>"#,
            ),
            ("yesterday", r#"<span class="muted">yesterday</span>"#),
        ];
        for (input, want) in table {
            assert_eq!(when(input, now).into_string(), want, "{input}");
        }
    }

    #[test]
    fn confirmation_patterns_match_only_the_name() {
        for (name, want) in [
            ("prod", "prod"),
            ("my.ws-1_x", r"my\.ws-1_x"),
            ("a.b.c", r"a\.b\.c"),
        ] {
            assert_eq!(exact_pattern(name), want);
        }
    }
}
