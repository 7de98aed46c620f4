//! stategate: a safe home for OpenTofu/Terraform state in front of an S3-compatible store.
//! See ARCHITECTURE.md for the map.

pub mod address;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod crypto;
pub mod drain;
pub mod drift;
pub mod error;
pub mod http;
pub mod installation;
pub mod jobs;
pub mod keys;
pub mod log;
pub mod metrics;
pub mod names;
pub mod operator;
pub mod schema;
pub mod server;
pub mod store;
pub mod tfstate;
pub mod tofu;
pub mod tokens;
pub mod turns;
pub mod ui;
