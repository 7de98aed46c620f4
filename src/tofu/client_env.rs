//! What a Terraform or OpenTofu client needs to reach a workspace: the backend's
//! addresses and derived credential (and OpenTofu's encryption passphrase), as
//! variables or shell lines (`workspace env`, drift checks' children).

use super::*;

/// The variables that make `terraform init` work with a bare `backend "http" {}`:
/// the address, lock addresses and credential, and optionally OpenTofu's
/// `TF_ENCRYPTION` with a derived passphrase. `workspace env` prints them; drift
/// checks put them into their child's environment.
pub fn client_vars(
    base_url: &str,
    workspace: &str,
    root: &RootKey,
    encryption: bool,
) -> Vec<(&'static str, String)> {
    let address = format!("{base_url}/api/v1/tf/state/{workspace}");
    let mut vars = vec![
        ("TF_HTTP_ADDRESS", address.clone()),
        ("TF_HTTP_LOCK_ADDRESS", address.clone()),
        ("TF_HTTP_UNLOCK_ADDRESS", address),
        ("TF_HTTP_USERNAME", "stategate".to_string()),
        ("TF_HTTP_PASSWORD", root.workspace_bearer(workspace)),
    ];
    if encryption {
        let passphrase = root.workspace_passphrase(workspace);
        let hcl = format!(
            "key_provider \"pbkdf2\" \"stategate\" {{ passphrase = \"{passphrase}\" }}\n\
             method \"aes_gcm\" \"stategate\" {{ keys = key_provider.pbkdf2.stategate }}\n\
             state {{ method = method.aes_gcm.stategate }}\n\
             plan {{ method = method.aes_gcm.stategate }}"
        );
        vars.push(("TF_ENCRYPTION", hcl));
    }
    vars
}

/// Shell `export` lines of [`client_vars`] with the bearer of credential `generation`
/// (no value holds a single quote).
pub fn client_env(
    base_url: &str,
    workspace: &str,
    root: &RootKey,
    generation: u64,
    encryption: bool,
) -> String {
    client_vars(base_url, workspace, root, encryption)
        .into_iter()
        .map(|(name, value)| match name {
            "TF_HTTP_PASSWORD" => (name, root.workspace_bearer_at(workspace, generation)),
            _ => (name, value),
        })
        .map(|(name, value)| format!("export {name}='{value}'\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_env_lines() {
        let root = RootKey::from_bytes([3; 32]);
        let plain = client_env("http://h:1", "prod", &root, 0, false);
        let lines: Vec<&str> = plain.lines().collect();
        assert_eq!(
            lines,
            vec![
                "export TF_HTTP_ADDRESS='http://h:1/api/v1/tf/state/prod'",
                "export TF_HTTP_LOCK_ADDRESS='http://h:1/api/v1/tf/state/prod'",
                "export TF_HTTP_UNLOCK_ADDRESS='http://h:1/api/v1/tf/state/prod'",
                "export TF_HTTP_USERNAME='stategate'",
                &format!(
                    "export TF_HTTP_PASSWORD='{}'",
                    root.workspace_bearer("prod")
                ),
            ]
        );
        let encrypted = client_env("http://h:1", "prod", &root, 0, true);
        let rotated = client_env("http://h:1", "prod", &root, 2, false);
        assert!(rotated.contains(&root.workspace_bearer_at("prod", 2)));
        assert!(!rotated.contains(&root.workspace_bearer("prod")));
        assert!(encrypted.starts_with(&plain));
        let passphrase = root.workspace_passphrase("prod");
        assert!(passphrase.len() >= 16);
        assert!(encrypted.contains(&format!("passphrase = \"{passphrase}\"")));
        assert!(encrypted.contains("method \"aes_gcm\""));
        assert!(!passphrase.contains('\'') && !passphrase.contains('"'));
    }
}
