//! The advisory writer lock of a graph: one object, `_graphloom/writer.lock`,
//! created with an atomic create-if-absent put. It turns a second writer
//! away early with a message naming the holder. Correctness does not rest on
//! it: every commit is also pinned to the table version the writer started
//! from (see [`super::Transaction`]), so even a writer that took over a lock
//! it wrongly believed abandoned cannot interleave commits with another.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use super::{Result, StoreError};

/// What the lock object records about its holder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LockInfo {
    /// Run that holds the lock.
    pub run_id: String,
    /// Command of that run (`add`, `run`, `recover`).
    pub command: String,
    /// Host name of the holder.
    pub host: String,
    /// Process id of the holder.
    pub pid: u32,
    /// When the lock was taken.
    pub acquired_at: DateTime<Utc>,
    /// Last renewal; a lock not renewed for `stale_after` is abandoned.
    pub heartbeat_at: DateTime<Utc>,
}

impl std::fmt::Display for LockInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "run {} (`{}`, pid {} on {}, since {}, last heartbeat {})",
            self.run_id,
            self.command,
            self.pid,
            self.host,
            self.acquired_at.format("%Y-%m-%dT%H:%M:%SZ"),
            self.heartbeat_at.format("%Y-%m-%dT%H:%M:%SZ"),
        )
    }
}

/// A held lock. Call [`LockGuard::release`]; dropping it only stops the
/// heartbeat, and the lock then goes stale after `stale_after`.
pub struct LockGuard {
    store: Arc<dyn ObjectStore>,
    path: Path,
    info: LockInfo,
    heartbeat: JoinHandle<()>,
}

impl LockGuard {
    /// Removes the lock if it is still ours.
    pub async fn release(self) -> Result<()> {
        self.heartbeat.abort();
        if let Ok(current) = read(&*self.store, &self.path).await
            && current.map(|c| c.run_id) == Some(self.info.run_id.clone())
        {
            self.store.delete(&self.path).await?;
        }
        Ok(())
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

/// This machine's host name, for lock records.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".to_string())
}

/// Whether a process of this host is gone. Only answers where `/proc`
/// exists; elsewhere the heartbeat age alone decides.
fn process_gone(pid: u32) -> bool {
    std::path::Path::new("/proc/self").exists()
        && !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

async fn read(store: &dyn ObjectStore, path: &Path) -> Result<Option<LockInfo>> {
    match store.get(path).await {
        Ok(got) => {
            let bytes = got.bytes().await?;
            Ok(serde_json::from_slice(&bytes).ok())
        }
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Takes the lock at `path` or fails with [`StoreError::Locked`] naming the
/// holder. A lock whose holder process is gone (same host) or whose
/// heartbeat is older than `stale_after` is taken over, with a warning.
pub async fn acquire(
    store: Arc<dyn ObjectStore>,
    path: Path,
    run_id: &str,
    command: &str,
    stale_after: Duration,
) -> Result<LockGuard> {
    let now = Utc::now();
    let info = LockInfo {
        run_id: run_id.to_string(),
        command: command.to_string(),
        host: host_name(),
        pid: std::process::id(),
        acquired_at: now,
        heartbeat_at: now,
    };
    // Two rounds: the second follows the removal of an abandoned lock.
    for _ in 0..2 {
        let body = PutPayload::from(serde_json::to_vec(&info).unwrap_or_default());
        let opts = PutOptions::from(PutMode::Create);
        match store.put_opts(&path, body, opts).await {
            Ok(_) => {
                let heartbeat =
                    spawn_heartbeat(store.clone(), path.clone(), info.clone(), stale_after);
                return Ok(LockGuard {
                    store,
                    path,
                    info,
                    heartbeat,
                });
            }
            Err(object_store::Error::AlreadyExists { .. }) => {
                let holder = read(&*store, &path).await?;
                let Some(holder) = holder else {
                    // Unreadable (torn by a crash while writing) or just released.
                    tracing::warn!("removing an unreadable writer lock at {path}");
                    store.delete(&path).await.ok();
                    continue;
                };
                let age = Utc::now().signed_duration_since(holder.heartbeat_at);
                let dead_here = holder.host == info.host && process_gone(holder.pid);
                let expired = age.to_std().is_ok_and(|a| a > stale_after);
                if dead_here || expired {
                    tracing::warn!(
                        "taking over the writer lock of {holder}: {}",
                        if dead_here {
                            "its process is gone".to_string()
                        } else {
                            format!("no heartbeat for {}s", age.num_seconds())
                        }
                    );
                    store.delete(&path).await.ok();
                    continue;
                }
                return Err(StoreError::Locked {
                    holder: holder.to_string(),
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Locked {
        holder: "another writer took the lock while an abandoned one was being removed".into(),
    })
}

fn spawn_heartbeat(
    store: Arc<dyn ObjectStore>,
    path: Path,
    mut info: LockInfo,
    stale_after: Duration,
) -> JoinHandle<()> {
    let every = (stale_after / 4).max(Duration::from_millis(250));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            match read(&*store, &path).await {
                Ok(Some(current)) if current.run_id == info.run_id => {}
                _ => {
                    tracing::warn!(
                        "writer lock at {path} is no longer ours; the commit will be refused if another writer moved the graph"
                    );
                    return;
                }
            }
            info.heartbeat_at = Utc::now();
            let body = PutPayload::from(serde_json::to_vec(&info).unwrap_or_default());
            if let Err(e) = store.put(&path, body).await {
                tracing::warn!("cannot renew writer lock at {path}: {e}");
            }
        }
    })
}

/// Reads the current lock holder, if any (for `graphloom status`).
pub async fn holder(store: &dyn ObjectStore, path: &Path) -> Result<Option<LockInfo>> {
    read(store, path).await
}
