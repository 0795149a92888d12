//! Plans on Apache DataFusion Ballista: `graphloom cluster scheduler`,
//! `graphloom cluster executor`, and sessions whose queries run there
//! (`graphloom sql --cluster df://HOST:PORT`).
//!
//! What a cluster process needs from graphloom, and how it gets it:
//!
//! * **functions**: graphloom's SQL functions carry data (type closures).
//!   The [`codec`] writes that data into the plan with each call, so a
//!   scheduler or executor rebuilds the function without knowing the graph;
//! * **tables**: a session reads the snapshot's Parquet files through
//!   listing tables ([`TableAccess::Files`]), which a plan can carry; the
//!   Delta providers cannot travel;
//! * **object stores**: every process resolves `s3://`, `az://`, `gs://`
//!   and `file://` URLs from its own environment, as graphloom does
//!   everywhere ([`crate::objstore::store_for`]).
//!
//! All of it is behind the `cluster` cargo feature; without it the
//! commands say how to build it.

#[cfg(feature = "cluster")]
pub mod codec;
#[cfg(feature = "cluster")]
mod process;
#[cfg(feature = "cluster")]
mod stores;

#[cfg(feature = "cluster")]
pub use process::{ExecutorOptions, SchedulerOptions, run_executor, run_scheduler};

use crate::query::TableAccess;

/// Errors of the cluster layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// This binary was built without the `cluster` feature.
    #[error(
        "this graphloom was built without cluster support; build it with `cargo build --release --features cluster`"
    )]
    NotBuilt,
    /// A cluster URL that is not `df://HOST:PORT`.
    #[error("cluster URL `{url}`: {reason} (expected df://HOST:PORT, e.g. df://127.0.0.1:50050)")]
    Url { url: String, reason: String },
    /// A scheduler or executor option that cannot work.
    #[error("{0}")]
    Config(String),
    /// Nothing answers at the scheduler's address.
    #[error(
        "cannot reach the scheduler at {url}: {reason} (is `graphloom cluster scheduler` running there?)"
    )]
    Unreachable { url: String, reason: String },
    /// A directory the process needs could not be made.
    #[error("cannot create {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The scheduler or executor stopped with an error.
    #[error("{process} failed: {message}")]
    Process {
        process: &'static str,
        message: String,
    },
    /// A DataFusion step failed.
    #[error("{step}: {source}")]
    DataFusion {
        step: &'static str,
        #[source]
        source: datafusion::error::DataFusionError,
    },
    /// The graph could not be opened.
    #[error(transparent)]
    Query(#[from] crate::query::QueryError),
    /// The graph's store could not be read or written.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

impl ClusterError {
    /// Whether the user fixes this by changing the command (exit code 2).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            ClusterError::NotBuilt | ClusterError::Url { .. } | ClusterError::Config(_)
        )
    }
}

/// Result alias for the cluster layer.
pub type Result<T, E = ClusterError> = std::result::Result<T, E>;

/// A parsed `df://HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterUrl {
    /// Scheduler host name or address.
    pub host: String,
    /// Scheduler port.
    pub port: u16,
}

impl ClusterUrl {
    /// Parses `df://HOST:PORT` (nothing after the port).
    pub fn parse(text: &str) -> Result<Self> {
        let rest = text
            .strip_prefix("df://")
            .ok_or_else(|| ClusterError::Url {
                url: text.to_string(),
                reason: "the scheme must be df://".to_string(),
            })?;
        Self::address(text, rest.strip_suffix('/').unwrap_or(rest))
    }

    /// Parses a bare `HOST:PORT` (an executor's `--scheduler`).
    pub fn from_address(address: &str) -> Result<Self> {
        Self::address(address, address)
    }

    /// `rest` as `HOST:PORT`; errors name `text`, what the user wrote.
    fn address(text: &str, rest: &str) -> Result<Self> {
        let bad = |reason: &str| ClusterError::Url {
            url: text.to_string(),
            reason: reason.to_string(),
        };
        let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("no port given"))?;
        if host.is_empty() || host.contains('/') || host.contains('@') {
            return Err(bad("the host must be a name or an address"));
        }
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad("the port must be a number from 1 to 65535"))?;
        Ok(ClusterUrl {
            host: host.to_string(),
            port,
        })
    }
}

impl std::fmt::Display for ClusterUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "df://{}:{}", self.host, self.port)
    }
}

/// A session whose queries run on the Ballista scheduler at `url`, with
/// graphloom's codec. Fails at once when nothing listens there.
#[cfg(feature = "cluster")]
pub async fn connect(url: &ClusterUrl) -> Result<datafusion::prelude::SessionContext> {
    // Ballista connects at the first query and reports a refused
    // connection as a bare transport error; say it plainly up front.
    let address = format!("{}:{}", url.host, url.port);
    let reach = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tokio::net::TcpStream::connect(&address),
    )
    .await;
    let reason = match reach {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some("no answer within 10 s".to_string()),
    };
    if let Some(reason) = reason {
        return Err(ClusterError::Unreachable {
            url: url.to_string(),
            reason,
        });
    }
    use ballista::prelude::{SessionConfigExt, SessionContextExt};
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::{SessionConfig, SessionContext};
    use std::sync::Arc;

    let config = SessionConfig::new_with_ballista()
        .with_ballista_logical_extension_codec(Arc::new(codec::LogicalCodec::default()))
        .with_ballista_physical_extension_codec(Arc::new(codec::PhysicalCodec::default()));
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .build();
    SessionContext::remote_with_state(&url.to_string(), state)
        .await
        .map_err(|source| ClusterError::DataFusion {
            step: "connecting to the scheduler",
            source,
        })
}

/// Without the `cluster` feature: says how to build it.
#[cfg(not(feature = "cluster"))]
pub async fn connect(_url: &ClusterUrl) -> Result<datafusion::prelude::SessionContext> {
    Err(ClusterError::NotBuilt)
}

/// Opens the graph's last completed run in a session on the cluster at
/// `url`: the same tables and functions as an in-process session.
#[cfg(feature = "cluster")]
pub async fn open_graph(
    store: &crate::store::GraphStore,
    url: &ClusterUrl,
) -> Result<crate::query::GraphSession> {
    let ctx = connect(url).await?;
    Ok(crate::query::GraphSession::open_in(store, ctx, TableAccess::Files).await?)
}

/// Makes `ctx`, a session on a cluster, ready for a run's resolution: the
/// graph's tables as the run found them, as Parquet listings the
/// executors read themselves, and the scratch tables resolution registers
/// (the run's mentions, their keys) written as Parquet files under the
/// graph's `_graphloom/scratch/RUN/`, which every process reaches as it
/// reaches the graph. Scratch files a killed run left are deleted first
/// (the caller holds the writer lock).
pub async fn prepare_resolution(
    ctx: &datafusion::prelude::SessionContext,
    tx: &crate::store::Transaction,
) -> Result<()> {
    let store = tx.store();
    store.clear_scratch().await?;
    // The client plans over the same files: it lists and reads them
    // through the graph's own store and settings.
    ctx.runtime_env()
        .register_object_store(store.url(), store.object_store());
    tx.base_snapshot().register_files(ctx).await?;
    let root = store
        .scratch_url()
        .join(&format!("{}/", tx.run_id()))
        .map_err(|e| {
            ClusterError::Config(format!("scratch directory for run {}: {e}", tx.run_id()))
        })?;
    ctx.state_ref()
        .write()
        .config_mut()
        .set_extension(std::sync::Arc::new(crate::scratch::ScratchFiles::new(
            root,
            store.object_store(),
        )));
    Ok(())
}

/// Without the `cluster` feature: says how to build it.
#[cfg(not(feature = "cluster"))]
pub async fn open_graph(
    _store: &crate::store::GraphStore,
    _url: &ClusterUrl,
) -> Result<crate::query::GraphSession> {
    let _ = TableAccess::Files;
    Err(ClusterError::NotBuilt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_addresses_are_host_and_port_without_a_scheme() {
        let a = ClusterUrl::from_address("10.0.0.1:50050").expect("valid");
        assert_eq!((a.host.as_str(), a.port), ("10.0.0.1", 50050));
        for bad in ["10.0.0.1", "10.0.0.1:x", ":1", "h:0"] {
            assert!(ClusterUrl::from_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cluster_urls_need_the_df_scheme_a_host_and_a_port() {
        let url = ClusterUrl::parse("df://127.0.0.1:50050").expect("valid");
        assert_eq!(url.host, "127.0.0.1");
        assert_eq!(url.port, 50050);
        assert_eq!(url.to_string(), "df://127.0.0.1:50050");
        assert_eq!(
            ClusterUrl::parse("df://sched.internal:7000/").expect("trailing slash"),
            ClusterUrl {
                host: "sched.internal".into(),
                port: 7000
            }
        );
        for bad in [
            "http://127.0.0.1:50050",
            "df://127.0.0.1",
            "df://:50050",
            "df://h:0",
            "df://h:70000",
            "df://h:50050/path",
            "df://user@h:1",
        ] {
            let e = ClusterUrl::parse(bad).expect_err(bad);
            assert!(e.is_usage(), "{bad}: {e}");
            assert!(e.to_string().contains("df://HOST:PORT"), "{e}");
        }
    }
}
