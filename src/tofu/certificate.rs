//! Client certificates as workspace credentials: the names a verified certificate
//! answers to ([`ClientIdentity`]), the grants of `[[tls.client_grants]]`
//! ([`Grants`]) and the one rule mapping the two to a [`Credential`] for a workspace.
//! Pure: the TLS listener verifies the chain (and the validity period) during the
//! handshake and hands the leaf here; the HTTP edge asks [`Grants::credential`] only
//! when the request carries no secret of its own.
//!
//! The subject rule: a certificate with a subject alternative name extension is
//! known by its DNS and URI names only; one without it by its common name(s). (A CN
//! beside SANs is ignored, as TLS clients ignore it for server names: a CA that
//! checks the SANs it signs may not check the CN.) Names are compared exactly.

use crate::config::{ClientGrant, TlsConfig};
use crate::names::Pattern;

use super::access::{Credential, Scope};

/// Longest subject accepted, in config and in a certificate (a DNS name's limit).
pub const MAX_SUBJECT_LEN: usize = 253;
/// Most names of one certificate looked at; the rest can never match.
const MAX_NAMES: usize = 32;

/// A subject in a grant or a certificate: printable ASCII, no leading or trailing
/// space, at most [`MAX_SUBJECT_LEN`] bytes. Anything else can never match (and
/// would be unsafe to record as `cert:<subject>`).
fn valid_subject(subject: &str) -> bool {
    !subject.is_empty()
        && subject.len() <= MAX_SUBJECT_LEN
        && subject.trim() == subject
        && subject.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// The names a verified client certificate answers to, by the subject rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    names: Vec<String>,
}

impl ClientIdentity {
    /// The identity of a leaf certificate (DER), or `None` when it cannot be parsed or
    /// carries no usable name. Only call it on a certificate the TLS layer verified.
    pub fn from_der(der: &[u8]) -> Option<ClientIdentity> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let mut names: Vec<String> = Vec::new();
        let mut keep = |name: &str| {
            if valid_subject(name) && names.len() < MAX_NAMES && !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        };
        // A SAN extension that does not parse makes the certificate nameless: never
        // fall back to the CN for it.
        match cert.subject_alternative_name().ok()? {
            Some(san) => {
                for name in &san.value.general_names {
                    if let GeneralName::DNSName(n) | GeneralName::URI(n) = name {
                        keep(n);
                    }
                }
            }
            None => {
                for cn in cert.subject().iter_common_name() {
                    if let Ok(cn) = cn.as_str() {
                        keep(cn);
                    }
                }
            }
        }
        (!names.is_empty()).then_some(ClientIdentity { names })
    }

    #[cfg(test)]
    fn from_names<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> ClientIdentity {
        ClientIdentity {
            names: names.into_iter().map(Into::into).collect(),
        }
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// One grant: certificates known as `subject` may act on workspaces matching
/// `workspaces`, limited to `scope`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub subject: String,
    pub workspaces: Pattern,
    pub scope: Scope,
}

/// A `[[tls.client_grants]]` entry that cannot be meant. The message names the key
/// (`tls.client_grants[2].scope`) and states the rule, never echoes the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tls.client_grants[{index}].{key}: {rule}")]
pub struct InvalidGrant {
    /// 1-based, as a person counts the entries in the file.
    index: usize,
    key: &'static str,
    rule: String,
}

/// The configured grants, in file order.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    grants: Vec<Grant>,
}

impl Grants {
    /// Reads `[[tls.client_grants]]` (their number and the keys they need were checked
    /// by `Config::validate`).
    pub fn from_config(tls: &TlsConfig) -> Result<Grants, InvalidGrant> {
        let grants = tls
            .client_grants
            .iter()
            .enumerate()
            .map(|(i, grant)| Grant::parse(i + 1, grant))
            .collect::<Result<_, _>>()?;
        Ok(Grants { grants })
    }

    pub fn len(&self) -> usize {
        self.grants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    /// The credential `identity` holds for `workspace`: the first grant (in file
    /// order) for one of its names whose pattern matches the workspace, or `None`
    /// (the same 401 as a wrong secret).
    pub fn credential(&self, identity: &ClientIdentity, workspace: &str) -> Option<Credential> {
        self.grants
            .iter()
            .find(|g| identity.names.contains(&g.subject) && g.workspaces.matches(workspace))
            .map(|g| Credential::Certificate {
                subject: g.subject.clone(),
                scope: g.scope,
            })
    }
}

impl Grant {
    fn parse(index: usize, grant: &ClientGrant) -> Result<Grant, InvalidGrant> {
        let refuse = |key: &'static str, rule: String| InvalidGrant { index, key, rule };
        if !valid_subject(&grant.subject) {
            return Err(refuse(
                "subject",
                format!("use 1-{MAX_SUBJECT_LEN} printable ASCII characters without leading or trailing spaces (a DNS or URI SAN, or the CN)"),
            ));
        }
        let workspaces =
            Pattern::parse(&grant.workspaces).map_err(|e| refuse("workspaces", e.to_string()))?;
        let scope = Scope::parse(&grant.scope).map_err(|e| refuse("scope", e.to_string()))?;
        Ok(Grant {
            subject: grant.subject.clone(),
            workspaces,
            scope,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(grants: &[(&str, &str, &str)]) -> TlsConfig {
        TlsConfig {
            client_grants: grants
                .iter()
                .map(|(subject, workspaces, scope)| ClientGrant {
                    subject: subject.to_string(),
                    workspaces: workspaces.to_string(),
                    scope: scope.to_string(),
                })
                .collect(),
            ..TlsConfig::default()
        }
    }

    #[test]
    fn grants_are_read_strictly_naming_the_key() {
        let long = "a".repeat(MAX_SUBJECT_LEN + 1);
        // (subject, workspaces, scope, the refusal's prefix or None)
        let table: &[(&str, &str, &str, Option<&str>)] = &[
            ("ci-prod", "prod-*", "write", None),
            ("spiffe://acme/ci", "*", "read", None),
            ("CI Prod", "app", "outputs", None),
            ("", "prod-*", "write", Some("tls.client_grants[2].subject:")),
            (
                " ci",
                "prod-*",
                "write",
                Some("tls.client_grants[2].subject:"),
            ),
            (
                "ci\n",
                "prod-*",
                "write",
                Some("tls.client_grants[2].subject:"),
            ),
            (
                "ci\u{e9}",
                "prod-*",
                "write",
                Some("tls.client_grants[2].subject:"),
            ),
            (
                &long,
                "prod-*",
                "write",
                Some("tls.client_grants[2].subject:"),
            ),
            ("ci", "", "write", Some("tls.client_grants[2].workspaces:")),
            (
                "ci",
                "prod/*",
                "write",
                Some("tls.client_grants[2].workspaces:"),
            ),
            (
                "ci",
                "prod-?",
                "write",
                Some("tls.client_grants[2].workspaces:"),
            ),
            (
                "ci",
                "prod-*",
                "admin",
                Some("tls.client_grants[2].scope: unknown scope"),
            ),
            ("ci", "prod-*", "", Some("tls.client_grants[2].scope:")),
            ("ci", "prod-*", "Write", Some("tls.client_grants[2].scope:")),
        ];
        for (subject, workspaces, scope, refused) in table {
            let tls = config(&[("first", "*", "read"), (subject, workspaces, scope)]);
            match (Grants::from_config(&tls), refused) {
                (Ok(grants), None) => assert_eq!(grants.grants.len(), 2),
                (Err(e), Some(prefix)) => {
                    let text = e.to_string();
                    assert!(text.starts_with(prefix), "{subject:?}: {text}");
                    // The refusal states the rule, never the value (it may be a secret
                    // pasted into the wrong key).
                    if !subject.is_empty() && *subject != "ci" {
                        assert!(!text.contains(subject.trim()), "{text}");
                    }
                }
                (got, want) => {
                    panic!("{subject:?} {workspaces:?} {scope:?}: {got:?}, wanted {want:?}")
                }
            }
        }
    }

    #[test]
    fn the_first_grant_for_a_name_and_workspace_decides() {
        let grants = Grants::from_config(&config(&[
            ("ci-prod", "prod-*", "write"),
            ("ci-prod", "*", "read"),
            ("reader", "*", "outputs"),
            ("spiffe://acme/deploy", "app", "write"),
        ]))
        .unwrap();
        let cert = |subject: &str, scope| {
            Some(Credential::Certificate {
                subject: subject.into(),
                scope,
            })
        };
        // (names of the certificate, workspace, credential)
        let table: Vec<(Vec<&str>, &str, Option<Credential>)> = vec![
            (vec!["ci-prod"], "prod-eu", cert("ci-prod", Scope::Write)),
            (vec!["ci-prod"], "staging", cert("ci-prod", Scope::Read)),
            (vec!["reader"], "prod-eu", cert("reader", Scope::Outputs)),
            (vec!["other", "reader"], "x", cert("reader", Scope::Outputs)),
            // The first grant in file order wins, whichever of the names it is for.
            (
                vec!["reader", "ci-prod"],
                "prod-1",
                cert("ci-prod", Scope::Write),
            ),
            (
                vec!["spiffe://acme/deploy"],
                "app",
                cert("spiffe://acme/deploy", Scope::Write),
            ),
            (vec!["spiffe://acme/deploy"], "app2", None),
            // Exact comparison: no case folding, no prefixes, no patterns in names.
            (vec!["CI-PROD"], "prod-eu", None),
            (vec!["ci-prod.example"], "prod-eu", None),
            (vec!["ci-*"], "prod-eu", None),
            (vec!["nobody"], "prod-eu", None),
            (vec![], "prod-eu", None),
        ];
        for (names, workspace, want) in table {
            let identity = ClientIdentity::from_names(names.clone());
            assert_eq!(
                grants.credential(&identity, workspace),
                want,
                "{names:?} {workspace}"
            );
        }
        assert!(Grants::default().is_empty());
        assert_eq!(
            Grants::default().credential(&ClientIdentity::from_names(["ci-prod"]), "prod-eu"),
            None
        );
    }

    /// Certificates made once with the openssl CLI (see `testdata/README.md`).
    #[test]
    fn the_subject_rule_on_real_certificates() {
        let der = |pem: &str| {
            let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(body)
                .unwrap()
        };
        // (certificate, names it answers to)
        let table: &[(&str, Option<&[&str]>)] = &[
            // CN "ignored-cn", SAN DNS:ci-prod, URI:spiffe://acme/ci, IP:127.0.0.1, email
            (
                include_str!("testdata/san.pem"),
                Some(&["ci-prod", "spiffe://acme/ci"]),
            ),
            // CN "ci-cn" only
            (include_str!("testdata/cn.pem"), Some(&["ci-cn"])),
            // SAN with only an IP address and an email: nameless, the CN is not used
            (include_str!("testdata/ip_only.pem"), None),
        ];
        for (pem, want) in table {
            let got = ClientIdentity::from_der(&der(pem));
            let want = want.map(|names| ClientIdentity::from_names(names.iter().copied()));
            assert_eq!(got, want);
        }
        assert_eq!(ClientIdentity::from_der(b"not a certificate"), None);
        assert_eq!(ClientIdentity::from_der(&[]), None);
    }
}
