//! Where the CLI connects: the connection string from exactly one place, and the
//! robot lookups every command shares.

use anyhow::Context as _;
use bson::Document;

use super::Cli;
use crate::db::store::{Store, WriteConcernPolicy};

const DEFAULT_URI: &str = "mongodb://127.0.0.1:27017/slotpool";

/// The connection string, from exactly one of the flag (or `MONGODB_URI`) and the
/// file (or `MONGODB_URI_FILE`), else the local default.
pub(super) fn connection_string(cli: &Cli) -> anyhow::Result<String> {
    match (&cli.mongodb_uri, &cli.mongodb_uri_file) {
        (Some(_), Some(_)) => anyhow::bail!(
            "both a connection string (--mongodb-uri or MONGODB_URI) and a file \
             (--mongodb-uri-file or MONGODB_URI_FILE) are set; give only one"
        ),
        (Some(uri), None) => Ok(uri.clone()),
        (None, Some(path)) => read_uri_file(path).map_err(anyhow::Error::msg),
        (None, None) => Ok(DEFAULT_URI.to_string()),
    }
}

pub(super) async fn connect(uri: &str, policy: WriteConcernPolicy) -> anyhow::Result<Store> {
    Store::connect_with(uri, policy)
        .await
        .context("connecting to MongoDB (set --mongodb-uri or MONGODB_URI)")
}

/// Reads the connection string from a file (`--mongodb-uri-file`,
/// `MONGODB_URI_FILE`: the Docker-secrets convention). Surrounding whitespace, such
/// as the file's final newline, is not part of it.
pub(crate) fn read_uri_file(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the MongoDB URI file {}: {e}",
            crate::printable::escape(&path.display().to_string())
        )
    })?;
    let uri = text.trim();
    if uri.is_empty() {
        return Err(format!(
            "the MongoDB URI file {} is empty",
            crate::printable::escape(&path.display().to_string())
        ));
    }
    Ok(uri.to_string())
}

/// The robot named `name`, with only `only` of its fields (none: the whole
/// document), or an error that says where to look.
pub(super) async fn find_robot(
    store: &Store,
    name: &str,
    only: &[&str],
) -> anyhow::Result<Document> {
    let found = if only.is_empty() {
        crate::db::robots::whole(store, name).await?
    } else {
        crate::db::robots::by_name(store, name, only).await?
    };
    found.with_context(|| format!("no robot named {name:?}: see `slotpool robot list`"))
}
