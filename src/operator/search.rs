//! Search across workspaces: the resources whose Terraform address (module path, type,
//! name, index key) contains a substring, in each workspace's newest version. Bounded
//! per search — at most so many workspaces, so many bytes read and so many hits — and
//! the answer says which bound stopped it. Only addresses, types and modes leave this
//! module, never an attribute or output value; an address whose index key equals a
//! value Terraform marked sensitive is shown (and matched) with that key masked, so a
//! search can neither show a secret nor confirm a guess of one.

use serde::Serialize;
use serde_json::Value;

use crate::error::Error;

/// Longest query accepted.
pub const MAX_QUERY: usize = 200;

/// The bounds of one search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SearchLimits {
    /// Workspaces read at most (by name; the rest are not looked at).
    pub max_workspaces: usize,
    /// State bytes read at most; a workspace that would pass it is skipped.
    pub max_bytes: i64,
    /// Hits returned at most.
    pub max_hits: usize,
}

impl Default for SearchLimits {
    fn default() -> Self {
        SearchLimits {
            max_workspaces: 500,
            max_bytes: 64 * 1024 * 1024,
            max_hits: 500,
        }
    }
}

/// Which bound cut a search short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Truncated {
    Workspaces,
    Bytes,
    Hits,
}

/// One resource instance whose address matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SearchHit {
    pub workspace: String,
    pub version: i64,
    pub address: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// `managed` or `data`.
    pub mode: String,
}

/// What a search found and how much it looked at.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchResults {
    pub query: String,
    pub hits: Vec<SearchHit>,
    pub workspaces_scanned: usize,
    pub bytes_read: i64,
    /// Workspaces whose newest version is not a plain JSON state (encrypted by the client).
    pub not_searchable: Vec<String>,
    /// Workspaces whose newest version exists but could not be read (see the server log).
    pub unreadable: Vec<String>,
    /// Set when a bound stopped the search before it saw everything.
    pub truncated: Option<Truncated>,
    pub limits: SearchLimits,
}

/// The lower-cased query; empty or over-long ones are refused.
pub fn needle(query: &str) -> Result<String, Error> {
    let q = query.trim();
    if q.is_empty() {
        return Err(Error::Invalid(
            "q is required: part of a resource address, type or name (e.g. aws_instance, module.db)"
                .into(),
        ));
    }
    if q.chars().count() > MAX_QUERY {
        return Err(Error::Invalid(format!(
            "q is longer than {MAX_QUERY} characters"
        )));
    }
    Ok(q.to_lowercase())
}

impl SearchResults {
    pub fn new(query: &str, limits: SearchLimits) -> Self {
        SearchResults {
            query: query.trim().to_string(),
            hits: Vec::new(),
            workspaces_scanned: 0,
            bytes_read: 0,
            not_searchable: Vec::new(),
            unreadable: Vec::new(),
            truncated: None,
            limits,
        }
    }

    /// May a workspace of `size` bytes be read? Counts it if so. `false` with
    /// `Workspaces` means stop; with `Bytes`, skip this one (a smaller one may fit).
    pub fn admit(&mut self, size: i64) -> bool {
        if self.workspaces_scanned >= self.limits.max_workspaces {
            self.truncated = Some(Truncated::Workspaces);
            return false;
        }
        if self.bytes_read.saturating_add(size) > self.limits.max_bytes {
            self.truncated = Some(Truncated::Bytes);
            return false;
        }
        self.workspaces_scanned += 1;
        self.bytes_read += size;
        true
    }

    /// Has a bound been reached that ends the whole search?
    pub fn done(&self) -> bool {
        matches!(
            self.truncated,
            Some(Truncated::Workspaces | Truncated::Hits)
        )
    }

    /// Adds the matching resources of one workspace's state.
    pub fn scan(&mut self, workspace: &str, version: i64, state: &[u8], needle: &str) {
        let doc = match serde_json::from_slice::<Value>(state) {
            Ok(doc) if doc.get("resources").is_some() || doc.get("outputs").is_some() => doc,
            _ => {
                self.not_searchable.push(workspace.to_string());
                return;
            }
        };
        let secrets = super::diff::Secrets::of(&doc);
        for resource in doc["resources"].as_array().into_iter().flatten() {
            let instances: Vec<&Value> = match resource["instances"].as_array() {
                Some(list) if !list.is_empty() => list.iter().collect(),
                _ => vec![&Value::Null],
            };
            for instance in instances {
                let address = super::diff::shown_address(resource, instance, &secrets);
                if !address.to_lowercase().contains(needle) {
                    continue;
                }
                if self.hits.len() >= self.limits.max_hits {
                    self.truncated = Some(Truncated::Hits);
                    return;
                }
                let text = |k: &str| resource[k].as_str().unwrap_or("").to_string();
                self.hits.push(SearchHit {
                    workspace: workspace.to_string(),
                    version,
                    address,
                    kind: text("type"),
                    mode: text("mode"),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn state() -> Vec<u8> {
        json!({"version": 4, "serial": 1, "lineage": "l", "outputs": {}, "resources": [
            {"mode": "managed", "type": "aws_instance", "name": "web",
             "instances": [{"index_key": 0, "attributes": {"password": "S3CRET"}},
                           {"index_key": 1, "attributes": {}}]},
            {"module": "module.db", "mode": "managed", "type": "aws_db_instance", "name": "main",
             "instances": [{"attributes": {"id": "db-1"}}]},
            {"mode": "data", "type": "aws_ami", "name": "ubuntu", "instances": []},
        ]})
        .to_string()
        .into_bytes()
    }

    fn addresses(r: &SearchResults) -> Vec<&str> {
        r.hits.iter().map(|h| h.address.as_str()).collect()
    }

    #[test]
    fn matches_addresses_case_insensitively_and_never_values() {
        // (query, addresses found)
        let table: &[(&str, &[&str])] = &[
            (
                "aws_instance",
                &["aws_instance.web[0]", "aws_instance.web[1]"],
            ),
            ("MODULE.DB", &["module.db.aws_db_instance.main"]),
            ("ubuntu", &["data.aws_ami.ubuntu"]),
            ("web[1]", &["aws_instance.web[1]"]),
            ("S3CRET", &[]),
            ("db-1", &[]),
        ];
        for (query, want) in table {
            let mut r = SearchResults::new(query, SearchLimits::default());
            r.scan("prod", 3, &state(), &needle(query).unwrap());
            assert_eq!(addresses(&r), *want, "{query}");
            assert_eq!(r.truncated, None);
        }
        let mut r = SearchResults::new("db", SearchLimits::default());
        r.scan("prod", 3, &state(), "db");
        assert_eq!(r.hits[0].kind, "aws_db_instance");
        assert_eq!(r.hits[0].mode, "managed");
        let text = serde_json::to_string(&r).unwrap();
        assert!(!text.contains("S3CRET") && !text.contains("db-1"), "{text}");
        r.scan("enc", 1, br#"{"encrypted_data":"x"}"#, "db");
        assert_eq!(r.not_searchable, ["enc"]);
    }

    #[test]
    fn queries_and_bounds() {
        for bad in ["", "   ", &"x".repeat(MAX_QUERY + 1)] {
            assert!(needle(bad).is_err(), "{bad:?}");
        }
        assert_eq!(needle("  Module.DB ").unwrap(), "module.db");
        let limits = SearchLimits {
            max_workspaces: 2,
            max_bytes: 100,
            max_hits: 1,
        };
        let mut r = SearchResults::new("x", limits);
        assert!(r.admit(60));
        assert!(!r.admit(50), "over the byte bound: skipped");
        assert_eq!(r.truncated, Some(Truncated::Bytes));
        assert!(!r.done(), "a smaller one may still fit");
        assert!(r.admit(40));
        assert!(!r.admit(0), "the workspace bound");
        assert!(r.done());
        assert_eq!((r.workspaces_scanned, r.bytes_read), (2, 100));
        let mut r = SearchResults::new("aws", limits);
        r.scan("prod", 1, &state(), "aws");
        assert_eq!(r.hits.len(), 1);
        assert_eq!(r.truncated, Some(Truncated::Hits));
        assert!(r.done());
    }
}
