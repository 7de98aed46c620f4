//! What a workspace credential may do: which credential a request presented
//! ([`Credential`]), the scopes an issued token or a client certificate is limited to
//! ([`Scope`]), and the one rule over them, [`permits`]. Pure: the backend
//! authenticates (`tofu::TofuBackend::authenticate`), the HTTP edge asks [`permits`]
//! before any operation runs, and a refusal looks like a wrong credential (401), so it
//! tells nothing about which credentials exist.
//!
//! The scopes nest by what leaves the server: `outputs` reads a synthesized state
//! holding the outputs only (what `terraform_remote_state` needs), `read` the whole
//! current state, `write` adds lock, write and unlock. Only the workspace's own
//! derived credential (and a drift run's) may DELETE.

use std::fmt;

/// What an issued workspace token or a certificate grant is limited to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// GET of the outputs-only state (`/api/v1/tf/outputs/<workspace>`).
    Outputs,
    /// GET of the whole current state.
    Read,
    /// GET, LOCK, POST and UNLOCK: what `terraform apply` needs.
    Write,
}

impl Scope {
    pub const ALL: [Scope; 3] = [Scope::Outputs, Scope::Read, Scope::Write];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Outputs => "outputs",
            Scope::Read => "read",
            Scope::Write => "write",
        }
    }

    pub fn parse(text: &str) -> Result<Scope, InvalidScope> {
        Scope::ALL
            .into_iter()
            .find(|s| s.as_str() == text.trim())
            .ok_or(InvalidScope)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A scope that is not one of the three. The message states the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown scope: use outputs, read or write")]
pub struct InvalidScope;

/// What a request to the backend does, as far as permission goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// GET of the outputs-only state.
    ReadOutputs,
    /// GET of the current state.
    ReadState,
    /// LOCK, POST or UNLOCK.
    Write,
    /// DELETE of the workspace's state.
    Delete,
}

/// The credential a request to a workspace presented.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// The workspace's derived bearer (what `workspace env` prints).
    Workspace,
    /// A credential issued for one drift run, by its name (`drift:run-N`).
    Run(String),
    /// An issued workspace token, by its name, limited to `scope`; `include_sensitive`:
    /// its grant shows sensitive outputs in the outputs-only state.
    Token {
        name: String,
        scope: Scope,
        include_sensitive: bool,
    },
    /// A verified client certificate, by its subject, mapped in config to `scope`.
    Certificate { subject: String, scope: Scope },
    /// Another workspace's own credential, named by this workspace as a consumer of
    /// its outputs (remote-state sharing).
    Consumer { workspace: String },
    /// A CI job's OIDC identity token (`tofu::ci_identity`), by the identity its
    /// issuer's template wrote (`github:acme/infra@refs/heads/main#run 812`), limited to
    /// the highest scope its rules give on this workspace.
    Ci { identity: String, scope: Scope },
}

impl Credential {
    /// The name it is recorded under (lock rows, versions, audit actors):
    /// `tf:<workspace>`, the run credential's name, `token:<name>`, `cert:<subject>`,
    /// `consumer:<workspace>` or `ci:<issuer name>:<identity>`.
    pub fn name(&self, workspace: &str) -> String {
        match self {
            Credential::Workspace => format!("tf:{workspace}"),
            Credential::Run(name) => name.clone(),
            Credential::Token { name, .. } => format!("token:{name}"),
            Credential::Certificate { subject, .. } => format!("cert:{subject}"),
            Credential::Consumer { workspace } => format!("consumer:{workspace}"),
            Credential::Ci { identity, .. } => format!("ci:{identity}"),
        }
    }
}

/// The prefixes of [`Credential::name`] that a workspace's name follows.
pub const WORKSPACE_NAMED: [&str; 2] = ["tf:", "consumer:"];

/// The workspace a recorded credential name carries, with the prefix before it
/// (`tf:prod` → `("tf:", "prod")`); `None` for a token, a certificate or a run.
pub fn named_workspace(name: &str) -> Option<(&'static str, &str)> {
    WORKSPACE_NAMED
        .into_iter()
        .find_map(|p| name.strip_prefix(p).map(|w| (p, w)))
}

/// The rule: may `credential` do `what`?
pub fn permits(credential: &Credential, what: Use) -> bool {
    let scoped = |scope: Scope| match what {
        Use::ReadOutputs => true,
        Use::ReadState => scope >= Scope::Read,
        Use::Write => scope >= Scope::Write,
        Use::Delete => false,
    };
    match credential {
        Credential::Workspace | Credential::Run(_) => true,
        Credential::Token { scope, .. }
        | Credential::Certificate { scope, .. }
        | Credential::Ci { scope, .. } => scoped(*scope),
        Credential::Consumer { .. } => what == Use::ReadOutputs,
    }
}

/// Does the outputs-only state `credential` reads keep the sensitive outputs? A
/// credential that may read the whole state sees them anyway; an `outputs` token only
/// when its grant says so; a consumer never.
pub fn shows_sensitive_outputs(credential: &Credential) -> bool {
    permits(credential, Use::ReadState)
        || matches!(
            credential,
            Credential::Token {
                include_sensitive: true,
                ..
            }
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_each_credential_may_do() {
        let token = |scope| Credential::Token {
            name: "ci".into(),
            scope,
            include_sensitive: false,
        };
        let consumer = Credential::Consumer {
            workspace: "app".into(),
        };
        let ci = |scope| Credential::Ci {
            identity: "github:acme/infra@refs/heads/main".into(),
            scope,
        };
        // (credential, outputs, read, write, delete)
        let table = [
            (Credential::Workspace, [true, true, true, true]),
            (
                Credential::Run("drift:run-1".into()),
                [true, true, true, true],
            ),
            (token(Scope::Outputs), [true, false, false, false]),
            (token(Scope::Read), [true, true, false, false]),
            (token(Scope::Write), [true, true, true, false]),
            (consumer, [true, false, false, false]),
            (ci(Scope::Outputs), [true, false, false, false]),
            (ci(Scope::Read), [true, true, false, false]),
            (ci(Scope::Write), [true, true, true, false]),
        ];
        let uses = [Use::ReadOutputs, Use::ReadState, Use::Write, Use::Delete];
        for (credential, expected) in table {
            for (what, allowed) in uses.into_iter().zip(expected) {
                assert_eq!(
                    permits(&credential, what),
                    allowed,
                    "{credential:?} {what:?}"
                );
            }
        }
    }

    #[test]
    fn who_sees_sensitive_outputs() {
        let token = |scope, include_sensitive| Credential::Token {
            name: "ci".into(),
            scope,
            include_sensitive,
        };
        let table = [
            (Credential::Workspace, true),
            (Credential::Run("drift:run-1".into()), true),
            (token(Scope::Outputs, false), false),
            (token(Scope::Outputs, true), true),
            (token(Scope::Read, false), true),
            (token(Scope::Write, false), true),
            (
                Credential::Consumer {
                    workspace: "app".into(),
                },
                false,
            ),
        ];
        for (credential, sees) in table {
            assert_eq!(shows_sensitive_outputs(&credential), sees, "{credential:?}");
        }
    }

    #[test]
    fn scopes_parse_strictly() {
        for scope in Scope::ALL {
            assert_eq!(Scope::parse(scope.as_str()), Ok(scope));
        }
        for bad in ["", "Write", "admin", "read,write", "*"] {
            assert_eq!(Scope::parse(bad), Err(InvalidScope), "{bad:?}");
        }
    }
}
