//! The server's externally visible address, recorded in the data dir.
//!
//! A saved Terraform plan carries the backend address it was planned against, and
//! `workspace env` prints the address clients are told to use. Operator commands may
//! run with less configuration than the server (no `public_url` in their environment),
//! so the server writes the address it serves under to `<data_dir>/address` at start,
//! and `workspace env` prints that. A record that no longer matches the configuration
//! is rewritten at start (with a log line), never trusted over it.

use std::path::PathBuf;

use crate::config::Config;

fn record_path(config: &Config) -> PathBuf {
    config.data_dir.join("address")
}

/// What happened to the record at startup.
#[derive(Debug, PartialEq, Eq)]
pub enum Recorded {
    Unchanged,
    Created,
    /// The old record, replaced.
    Rewritten(String),
}

/// Writes the configured address into the data dir unless it is already recorded.
pub fn record(config: &Config) -> std::io::Result<Recorded> {
    let path = record_path(config);
    let current = config.base_url();
    let old = match std::fs::read_to_string(&path) {
        Ok(text) => Some(text.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    if old.as_deref() == Some(current.as_str()) {
        return Ok(Recorded::Unchanged);
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{current}\n"))?;
    std::fs::rename(&tmp, &path)?;
    Ok(match old {
        None => Recorded::Created,
        Some(old) => Recorded::Rewritten(old),
    })
}

/// [`record`] with the log line the operator needs when the address changed.
pub fn record_and_log(config: &Config) {
    match record(config) {
        Ok(Recorded::Rewritten(old)) => tracing::warn!(
            old = %old,
            new = %config.base_url(),
            "the server's address changed: rewrote the address record; plan files saved \
             against the old address must be re-planned, and `workspace env` now prints the new one"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot record the server's address in the data dir"),
    }
}

/// The address clients should use: the server's record, else the configuration.
pub fn for_clients(config: &Config) -> String {
    if config.public_url.is_some() {
        return config.base_url();
    }
    std::fs::read_to_string(record_path(config))
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| t.starts_with("http://") || t.starts_with("https://"))
        .unwrap_or_else(|| config.base_url())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_follows_the_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config {
            data_dir: dir.path().to_path_buf(),
            ..Config::default()
        };
        config.public_url = Some("https://state.example/".into());
        assert_eq!(record(&config).unwrap(), Recorded::Created);
        assert_eq!(record(&config).unwrap(), Recorded::Unchanged);

        // An operator command without public_url prints what the server recorded.
        let mut operator = config.clone();
        operator.public_url = None;
        assert_eq!(for_clients(&operator), "https://state.example");

        // The server restarted under another address: the record is rewritten.
        config.public_url = Some("https://new.example".into());
        assert_eq!(
            record(&config).unwrap(),
            Recorded::Rewritten("https://state.example".into())
        );
        assert_eq!(for_clients(&operator), "https://new.example");
        // The configuration wins over the record whenever it names an address.
        operator.public_url = Some("http://override:1".into());
        assert_eq!(for_clients(&operator), "http://override:1");

        // No record, or a garbage one: the configuration.
        std::fs::write(dir.path().join("address"), "garbage").unwrap();
        let bare = Config {
            data_dir: dir.path().to_path_buf(),
            ..Config::default()
        };
        assert_eq!(for_clients(&bare), "http://127.0.0.1:8080");
    }
}
