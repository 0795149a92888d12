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
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
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
    /// Removes the lock if it is still ours. The delete itself cannot be
    /// made conditional (object_store has no conditional delete), so a
    /// lock taken over between the check and the delete would be removed;
    /// a writer only loses its lock that way after going stale, and its
    /// commits are refused by the version guard anyway.
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

/// The lock object as read: its holder (`None` when the object does not
/// parse, e.g. a write torn by a crash) and the version a conditional
/// overwrite must match.
struct Current {
    holder: Option<LockInfo>,
    version: UpdateVersion,
}

async fn read_current(store: &dyn ObjectStore, path: &Path) -> Result<Option<Current>> {
    match store.get(path).await {
        Ok(got) => {
            let version = UpdateVersion {
                e_tag: got.meta.e_tag.clone(),
                version: got.meta.version.clone(),
            };
            let bytes = got.bytes().await?;
            Ok(Some(Current {
                holder: serde_json::from_slice(&bytes).ok(),
                version,
            }))
        }
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

async fn read(store: &dyn ObjectStore, path: &Path) -> Result<Option<LockInfo>> {
    Ok(read_current(store, path).await?.and_then(|c| c.holder))
}

/// How an attempt to replace a lock object went.
enum Replaced {
    /// The object was the one read, and now holds ours.
    Ours(UpdateVersion),
    /// Someone changed or removed it since it was read: look again.
    Changed,
    /// The store cannot write conditionally on a version (local files).
    Unsupported,
}

/// Overwrites the lock object only if it is still the version read
/// (compare-and-swap: `If-Match` on S3 and Azure, generation match on GCS).
/// This is how an abandoned lock is taken over and how a heartbeat renews
/// it, so neither can clobber a lock another writer took in between.
async fn replace(
    store: &dyn ObjectStore,
    path: &Path,
    seen: &UpdateVersion,
    info: &LockInfo,
) -> Result<Replaced> {
    if seen.e_tag.is_none() && seen.version.is_none() {
        return Ok(Replaced::Unsupported);
    }
    let body = PutPayload::from(serde_json::to_vec(info).unwrap_or_default());
    let opts = PutOptions::from(PutMode::Update(seen.clone()));
    match store.put_opts(path, body, opts).await {
        Ok(put) => Ok(Replaced::Ours(UpdateVersion {
            e_tag: put.e_tag,
            version: put.version,
        })),
        Err(
            object_store::Error::Precondition { .. }
            | object_store::Error::AlreadyExists { .. }
            | object_store::Error::NotFound { .. },
        ) => Ok(Replaced::Changed),
        Err(object_store::Error::NotImplemented { .. }) => Ok(Replaced::Unsupported),
        Err(e) => Err(e.into()),
    }
}

/// Removes an abandoned lock where the store has no conditional write:
/// delete, then the caller's create-if-absent. Between our read and the
/// delete another writer could have taken the lock over first; the delete
/// would remove its lock. The commit guard still keeps the data safe
/// (each commit must land on the version the writer read).
async fn remove_unconditionally(store: &dyn ObjectStore, path: &Path) {
    match store.delete(path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => tracing::warn!("cannot remove the abandoned writer lock at {path}: {e}"),
    }
}

/// Takes the lock at `path` or fails with [`StoreError::Locked`] naming the
/// holder. A lock whose holder process is gone (same host), whose heartbeat
/// is older than `stale_after`, or that does not parse is taken over, with
/// a warning, by a conditional overwrite of exactly the object that was
/// judged abandoned.
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
    // A few rounds: each one that does not end here saw the lock change
    // under it (released, or taken by another writer), which is rare.
    for _ in 0..4 {
        let body = PutPayload::from(serde_json::to_vec(&info).unwrap_or_default());
        let opts = PutOptions::from(PutMode::Create);
        let version = match store.put_opts(&path, body, opts).await {
            Ok(put) => UpdateVersion {
                e_tag: put.e_tag,
                version: put.version,
            },
            Err(object_store::Error::AlreadyExists { .. }) => {
                let Some(current) = read_current(&*store, &path).await? else {
                    continue; // released since: try to create it again
                };
                match &current.holder {
                    None => tracing::warn!("replacing an unreadable writer lock at {path}"),
                    Some(holder) => {
                        let age = Utc::now().signed_duration_since(holder.heartbeat_at);
                        let dead_here = holder.host == info.host && process_gone(holder.pid);
                        let expired = age.to_std().is_ok_and(|a| a > stale_after);
                        if !(dead_here || expired) {
                            return Err(StoreError::Locked {
                                holder: holder.to_string(),
                            });
                        }
                        tracing::warn!(
                            "taking over the writer lock of {holder}: {}",
                            if dead_here {
                                "its process is gone".to_string()
                            } else {
                                format!("no heartbeat for {}s", age.num_seconds())
                            }
                        );
                    }
                }
                match replace(&*store, &path, &current.version, &info).await? {
                    Replaced::Ours(version) => version,
                    Replaced::Changed => continue,
                    Replaced::Unsupported => {
                        remove_unconditionally(&*store, &path).await;
                        continue;
                    }
                }
            }
            Err(e) => return Err(e.into()),
        };
        let heartbeat = spawn_heartbeat(
            store.clone(),
            path.clone(),
            info.clone(),
            version,
            stale_after,
        );
        return Ok(LockGuard {
            store,
            path,
            info,
            heartbeat,
        });
    }
    let holder = match read(&*store, &path).await? {
        Some(holder) => holder.to_string(),
        None => "another writer (the lock changed while this one tried to take it)".to_string(),
    };
    Err(StoreError::Locked { holder })
}

fn spawn_heartbeat(
    store: Arc<dyn ObjectStore>,
    path: Path,
    mut info: LockInfo,
    mut version: UpdateVersion,
    stale_after: Duration,
) -> JoinHandle<()> {
    let every = (stale_after / 4).max(Duration::from_millis(250));
    let lost = |path: &Path| {
        tracing::warn!(
            "writer lock at {path} is no longer ours; the commit will be refused if another writer moved the graph"
        );
    };
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            info.heartbeat_at = Utc::now();
            match replace(&*store, &path, &version, &info).await {
                Ok(Replaced::Ours(next)) => version = next,
                Ok(Replaced::Changed) => return lost(&path),
                Ok(Replaced::Unsupported) => {
                    // No conditional write here (local files): check, then put.
                    match read(&*store, &path).await {
                        Ok(Some(current)) if current.run_id == info.run_id => {}
                        _ => return lost(&path),
                    }
                    let body = PutPayload::from(serde_json::to_vec(&info).unwrap_or_default());
                    if let Err(e) = store.put(&path, body).await {
                        tracing::warn!("cannot renew writer lock at {path}: {e}");
                    }
                }
                Err(e) => tracing::warn!("cannot renew writer lock at {path}: {e}"),
            }
        }
    })
}

/// Reads the current lock holder, if any (for `graphloom status`).
pub async fn holder(store: &dyn ObjectStore, path: &Path) -> Result<Option<LockInfo>> {
    read(store, path).await
}
