//! What a UI login must pass before its token is looked at: it comes from this
//! server's own login page (login CSRF: a cross-site form would log the victim in as
//! the attacker's operator), it is not one too many from its client or from everyone
//! (429 with `Retry-After`), and the token has an operator token's shape, so guessing
//! never costs a job on the index's single writer. Also the one rule for where a login
//! may send the browser afterwards: a page of the UI, never another site.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::operator::identity::OPERATOR_TOKEN_PREFIX;

/// Characters after the prefix of an operator token: 32 random bytes in unpadded base64url.
const TOKEN_BODY_LEN: usize = 43;
/// Longest page a login remembers to return to.
const MAX_RETURN_PATH: usize = 1024;

/// How many logins are admitted: a burst, then a steady rate, per client address (an
/// IPv6 client by its /64) and for all clients together.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub per_client_burst: u32,
    /// One more login per client every this long.
    pub per_client_every: Duration,
    pub global_burst: u32,
    /// One more login for everyone every this long.
    pub global_every: Duration,
    /// Clients remembered at once; past that, new clients are bounded by the global
    /// limit only (a flood from many addresses cannot grow this map).
    pub max_clients: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_client_burst: 10,
            per_client_every: Duration::from_secs(6),
            global_burst: 60,
            global_every: Duration::from_millis(200),
            max_clients: 4096,
        }
    }
}

/// A token bucket: `tokens` logins left as of `at`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(burst: u32, now: Instant) -> Bucket {
        Bucket {
            tokens: f64::from(burst),
            at: now,
        }
    }

    /// Refills up to `burst` for the time passed since the last look.
    fn refill(&mut self, burst: u32, every: Duration, now: Instant) {
        let passed = now.saturating_duration_since(self.at).as_secs_f64();
        let earned = passed / every.as_secs_f64().max(1e-3);
        self.tokens = (self.tokens + earned).min(f64::from(burst));
        self.at = now;
    }

    /// Whole seconds until one login is available again (at least 1).
    fn wait(&self, every: Duration) -> u64 {
        let missing = (1.0 - self.tokens).max(0.0);
        ((missing * every.as_secs_f64()).ceil() as u64).max(1)
    }
}

struct Buckets {
    global: Bucket,
    clients: HashMap<IpAddr, Bucket>,
}

/// Why a login was refused before its token was looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not sent by this server's own login page.
    CrossSite,
    /// Too many logins; retry after this many seconds.
    Throttled { retry_after: u64 },
}

/// The request facts the cross-site check reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoginRequest<'a> {
    pub origin: Option<&'a str>,
    pub sec_fetch_site: Option<&'a str>,
    pub host: Option<&'a str>,
}

pub struct LoginGuard {
    limits: Limits,
    /// Hosts (`name[:port]`, lowercase) an `Origin` may name besides the request's
    /// own `Host`: the configured `public_url`'s, for a reverse proxy that rewrites `Host`.
    public_hosts: Vec<String>,
    buckets: Mutex<Buckets>,
}

impl LoginGuard {
    pub fn new(limits: Limits, public_url: Option<&str>) -> LoginGuard {
        LoginGuard {
            limits,
            public_hosts: public_url.and_then(origin_host).into_iter().collect(),
            buckets: Mutex::new(Buckets {
                global: Bucket::full(limits.global_burst, Instant::now()),
                clients: HashMap::new(),
            }),
        }
    }

    /// Admits a login attempt from `client` at `now`, or says why not. Cross-site
    /// first; an attempt refused as cross-site costs no one's budget.
    pub fn admit(
        &self,
        request: LoginRequest<'_>,
        client: Option<IpAddr>,
        now: Instant,
    ) -> Result<(), Refusal> {
        if !self.same_origin(request) {
            return Err(Refusal::CrossSite);
        }
        self.take(client, now)
            .map_err(|retry_after| Refusal::Throttled { retry_after })
    }

    /// Did the browser send this from our own page? `Sec-Fetch-Site`, when present,
    /// must be `same-origin` (or `none`: typed or bookmarked); `Origin`, when present,
    /// must name the request's own host (or the public URL's). A browser sends
    /// `Origin` on every form POST, so a cross-site one never lacks both; clients that
    /// send neither (curl) are not browsers a site could drive.
    pub fn same_origin(&self, r: LoginRequest<'_>) -> bool {
        if let Some(site) = r.sec_fetch_site {
            let site = site.trim();
            if !site.eq_ignore_ascii_case("same-origin") && !site.eq_ignore_ascii_case("none") {
                return false;
            }
        }
        let Some(origin) = r.origin else {
            return true;
        };
        // `null` (a sandboxed document, a redirect from elsewhere) is never ours.
        let Some(from) = origin_host(origin) else {
            return false;
        };
        let own = r.host.map(|h| h.trim().to_ascii_lowercase());
        own.as_deref() == Some(from.as_str()) || self.public_hosts.contains(&from)
    }

    /// Takes one login from the client's and the global bucket; `Err(seconds)` to wait.
    fn take(&self, client: Option<IpAddr>, now: Instant) -> Result<(), u64> {
        let l = &self.limits;
        let mut b = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Buckets { global, clients } = &mut *b;
        global.refill(l.global_burst, l.global_every, now);
        let key = client.map(client_key);
        if let Some(key) = key {
            if !clients.contains_key(&key) && clients.len() >= l.max_clients {
                // Forget clients whose bucket has filled up again: they are as new.
                clients.retain(|_, c| {
                    let mut probe = *c;
                    probe.refill(l.per_client_burst, l.per_client_every, now);
                    probe.tokens < f64::from(l.per_client_burst)
                });
            }
        }
        let room = clients.len() < l.max_clients;
        let mine = match key {
            Some(key) if room || clients.contains_key(&key) => Some(
                clients
                    .entry(key)
                    .or_insert_with(|| Bucket::full(l.per_client_burst, now)),
            ),
            _ => None,
        };
        if let Some(mine) = &mine {
            let mut probe = **mine;
            probe.refill(l.per_client_burst, l.per_client_every, now);
            if probe.tokens < 1.0 {
                return Err(probe.wait(l.per_client_every));
            }
        }
        if global.tokens < 1.0 {
            return Err(global.wait(l.global_every));
        }
        global.tokens -= 1.0;
        if let Some(mine) = mine {
            mine.refill(l.per_client_burst, l.per_client_every, now);
            mine.tokens -= 1.0;
        }
        Ok(())
    }
}

/// An IPv4 client by its address, an IPv6 client by its /64 (one host often holds all of it).
fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// `host[:port]` of an `http(s)://host[:port]` origin (or URL; a path is ignored),
/// lowercase; `None` for anything else (`null`, another scheme).
fn origin_host(origin: &str) -> Option<String> {
    let origin = origin.trim().to_ascii_lowercase();
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))?;
    let host = rest.split('/').next()?;
    (!host.is_empty() && !host.contains('@')).then(|| host.to_string())
}

/// Has `token` the shape of an operator token (`sgo_` and 43 base64url characters)?
/// Anything else cannot be one, and is refused without a database lookup.
pub fn plausible_operator_token(token: &[u8]) -> bool {
    token
        .strip_prefix(OPERATOR_TOKEN_PREFIX.as_bytes())
        .is_some_and(|body| {
            body.len() == TOKEN_BODY_LEN
                && body
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        })
}

/// `path` if a login may send the browser there afterwards: a page of the UI
/// (`/ui/…`, not login or logout), in plain URL characters, without `..` segments.
pub fn return_path(path: &str) -> Option<&str> {
    let plain = path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~%/?=&+".contains(&b));
    let page = path.starts_with("/ui/")
        && !path.starts_with("/ui/login")
        && !path.starts_with("/ui/logout")
        && !path.contains("//")
        && !path.split(['/', '?']).any(|s| s == ".." || s == ".");
    (plain && page && path.len() <= MAX_RETURN_PATH).then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(
        origin: Option<&'a str>,
        site: Option<&'a str>,
        host: Option<&'a str>,
    ) -> LoginRequest<'a> {
        LoginRequest {
            origin,
            sec_fetch_site: site,
            host,
        }
    }

    #[test]
    fn only_logins_from_our_own_page_pass() {
        let guard = LoginGuard::new(Limits::default(), Some("https://sg.example.net/"));
        let host = Some("127.0.0.1:8080");
        // (Origin, Sec-Fetch-Site, Host, admitted?)
        type Row<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>, bool);
        let table: &[Row] = &[
            (
                Some("http://127.0.0.1:8080"),
                Some("same-origin"),
                host,
                true,
            ),
            (Some("https://127.0.0.1:8080"), None, host, true),
            (None, None, host, true),
            (None, Some("none"), host, true),
            (
                Some("HTTP://127.0.0.1:8080"),
                None,
                Some("127.0.0.1:8080"),
                true,
            ),
            // Behind a proxy that rewrites Host: the public URL's host.
            (
                Some("https://sg.example.net"),
                Some("same-origin"),
                host,
                true,
            ),
            (Some("https://evil.example"), None, host, false),
            (
                Some("https://evil.example"),
                Some("cross-site"),
                host,
                false,
            ),
            (None, Some("cross-site"), host, false),
            (None, Some("same-site"), host, false),
            (Some("http://127.0.0.1:8081"), None, host, false),
            (Some("http://127.0.0.1"), None, host, false),
            (Some("null"), None, host, false),
            (Some(""), None, host, false),
            (Some("file://"), None, host, false),
            (
                Some("http://127.0.0.1:8080@evil.example"),
                None,
                host,
                false,
            ),
            (
                Some("http://127.0.0.1:8080"),
                Some("cross-site"),
                host,
                false,
            ),
            (Some("http://127.0.0.1:8080"), None, None, false),
        ];
        for &(origin, site, host, want) in table {
            let got = guard.admit(req(origin, site, host), None, Instant::now());
            assert_eq!(got == Ok(()), want, "{origin:?} {site:?} {host:?}: {got:?}");
            if !want {
                assert_eq!(got, Err(Refusal::CrossSite));
            }
        }
    }

    #[test]
    fn logins_are_throttled_per_client_and_for_everyone() {
        let limits = Limits {
            per_client_burst: 3,
            per_client_every: Duration::from_secs(10),
            global_burst: 5,
            global_every: Duration::from_secs(2),
            max_clients: 2,
        };
        let guard = LoginGuard::new(limits, None);
        let t0 = Instant::now();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let admit = |ip: IpAddr, t: Instant| guard.take(Some(ip), t);
        // (client, second, result)
        let table: &[(IpAddr, u64, Result<(), u64>)] = &[
            (a, 0, Ok(())),
            (a, 0, Ok(())),
            (a, 0, Ok(())),
            // a's burst is spent: one more in 10 s; others still get in.
            (a, 0, Err(10)),
            (b, 0, Ok(())),
            (b, 0, Ok(())),
            // The global burst (5) is spent: everyone waits for its 2 s.
            (c, 0, Err(2)),
            (b, 1, Err(1)),
            (c, 2, Ok(())),
            (a, 5, Err(5)),
            (a, 10, Ok(())),
            (a, 10, Err(10)),
        ];
        for (i, &(ip, s, want)) in table.iter().enumerate() {
            assert_eq!(admit(ip, at(s)), want, "row {i}: {ip} at {s}s");
        }
        // The map never holds more than max_clients; a new client past it is bounded
        // by the global limit alone.
        assert!(guard.buckets.lock().unwrap().clients.len() <= 2);
    }

    #[test]
    fn ipv6_clients_share_their_64() {
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let two: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(client_key(one), client_key(two));
        assert_ne!(client_key(one), client_key(other));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(client_key(mapped), "10.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn only_operator_shaped_tokens_reach_the_database() {
        let good = format!("sgo_{}", "a".repeat(43));
        assert!(plausible_operator_token(good.as_bytes()));
        let mixed = format!("sgo_{}xyz", "AZaz09-_".repeat(5));
        assert!(plausible_operator_token(mixed.as_bytes()));
        for bad in [
            String::new(),
            "sgo_".into(),
            "sgo_wrong".into(),
            format!("sgo_{}", "a".repeat(42)),
            format!("sgo_{}", "a".repeat(44)),
            format!("sgp_{}", "a".repeat(43)),
            format!("SGO_{}", "a".repeat(43)),
            format!("sgo_{}=", "a".repeat(42)),
            format!("sgo_{}/", "a".repeat(42)),
            format!("sgo_{}é", "a".repeat(41)),
            format!("sgo_{}", "a".repeat(10_000)),
        ] {
            assert!(!plausible_operator_token(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn a_login_returns_only_to_a_page_of_the_ui() {
        let long = format!("/ui/workspaces/{}", "a".repeat(MAX_RETURN_PATH));
        // (path, returned to?)
        let table: &[(&str, bool)] = &[
            ("/ui/", true),
            ("/ui/workspaces/prod", true),
            ("/ui/workspaces/prod/diff?from=1&to=2", true),
            ("/ui/search?q=terraform_data%2Eweb", true),
            ("/ui", false),
            ("/ui/login", false),
            ("/ui/logout", false),
            ("/ui//evil.example", false),
            ("//evil.example/ui/", false),
            ("https://evil.example/ui/", false),
            ("/ui/../api/v1/admin/x", false),
            ("/ui/./x", false),
            ("/ui/x/..?a=1", false),
            ("/ui/\\evil.example", false),
            ("/ui/x\r\nSet-Cookie: a=b", false),
            ("/ui/x\"><script>", false),
            ("/ui/x;a", false),
            ("/metrics", false),
            (&long, false),
        ];
        for &(path, want) in table {
            assert_eq!(return_path(path).is_some(), want, "{path}");
        }
    }
}
