//! The content-addressed response cache. A key is the hash of everything
//! that decides a reply (model, messages, schema, sampling parameters,
//! prompt version); the value is the reply text and its usage. Entries are
//! objects under the cache URL (default `<graph>/_cache/llm/`), one per key,
//! written with a single put: object stores make a put visible whole or not
//! at all (the local store writes a temporary file and renames it), so a
//! killed run cannot leave a torn entry. An unreadable entry counts as a
//! miss and is overwritten.

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

/// How a run uses the cache (`--no-cache`, `--refresh-cache`, `--replay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CacheMode {
    /// Read hits, write misses.
    #[default]
    ReadWrite,
    /// Ignore existing entries, write fresh ones.
    Refresh,
    /// Neither read nor write.
    Off,
    /// Read hits and never call the model (`graphloom run --replay`): a
    /// request without a cached reply fails with
    /// [`crate::llm::LlmError::NotCached`]. Nothing is written.
    Replay,
}

/// A cached reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CachedReply {
    /// What the model answered (chat) or the vectors (embeddings), as JSON.
    pub content: serde_json::Value,
    /// Prompt tokens the original call used.
    pub prompt_tokens: u64,
    /// Completion tokens the original call used.
    pub completion_tokens: u64,
    /// Model that answered.
    pub model: String,
}

/// The cache: a prefix in an object store.
#[derive(Clone)]
pub struct ResponseCache {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    mode: CacheMode,
    /// For a cache on the local file system, the directory of `prefix`:
    /// entries are read from it directly, without the object store's
    /// path-to-URL-to-path translation (a replay reads one per call).
    local_dir: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for ResponseCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseCache")
            .field("prefix", &self.prefix.as_ref())
            .field("mode", &self.mode)
            .finish()
    }
}

/// Hashes the parts of a request that decide its reply: BLAKE3 of their
/// compact JSON (exactly `serde_json::to_string(parts)`), streamed into
/// the hasher instead of built as a string first.
pub fn cache_key<T: Serialize + ?Sized>(parts: &T) -> String {
    let mut hasher = blake3::Hasher::new();
    {
        let mut out = std::io::BufWriter::with_capacity(16 * 1024, &mut hasher);
        // Writing into a hasher cannot fail, and the parts are plain data.
        let _ = serde_json::to_writer(&mut out, parts);
        let _ = std::io::Write::flush(&mut out);
    }
    hasher.finalize().to_hex().to_string()
}

impl ResponseCache {
    /// A cache under `prefix` of `store`.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: Path, mode: CacheMode) -> Self {
        ResponseCache {
            store,
            prefix,
            mode,
            local_dir: None,
        }
    }

    /// Opens the cache at `location` (an object store URL or path); the
    /// graph's default is `<graph>/_cache/llm/`.
    pub fn open(
        location: &str,
        options: &std::collections::BTreeMap<String, String>,
        mode: CacheMode,
    ) -> Result<Self, crate::objstore::LocationError> {
        let url = crate::objstore::parse_dir_url(location)?;
        let store = crate::objstore::store_for(&url, options)?;
        let prefix = crate::objstore::path_of(&url);
        // The directory the local store keeps `prefix` in, as it maps it.
        let local_dir = (url.scheme() == "file")
            .then(|| {
                object_store::local::LocalFileSystem::new()
                    .path_to_filesystem(&prefix)
                    .ok()
            })
            .flatten();
        Ok(ResponseCache {
            local_dir,
            ..ResponseCache::new(store, prefix, mode)
        })
    }

    /// The mode in effect.
    pub fn mode(&self) -> CacheMode {
        self.mode
    }

    /// Whether a miss must fail instead of calling the model.
    pub fn replay_only(&self) -> bool {
        self.mode == CacheMode::Replay
    }

    /// Where an entry lives below the prefix: `<first two characters>/<key>.json`.
    fn layout(key: &str) -> (&str, String) {
        (&key[..2.min(key.len())], format!("{key}.json"))
    }

    fn path(&self, key: &str) -> Path {
        let (shard, file) = Self::layout(key);
        self.prefix.clone().join(shard).join(file)
    }

    /// The entry for `key`, if reading is on and a readable entry exists.
    pub async fn get(&self, key: &str) -> Option<CachedReply> {
        if !matches!(self.mode, CacheMode::ReadWrite | CacheMode::Replay) {
            return None;
        }
        let bytes: bytes::Bytes = match &self.local_dir {
            Some(dir) => {
                let (shard, file) = Self::layout(key);
                let file = dir.join(shard).join(file);
                // Read in place: an entry is a few kilobytes on a local
                // disk, cheaper to read than to hand to the blocking pool
                // and back (the hand-off was most of a replayed call).
                std::fs::read(file).ok()?.into()
            }
            None => {
                let got = self.store.get(&self.path(key)).await.ok()?;
                got.bytes().await.ok()?
            }
        };
        match serde_json::from_slice(&bytes) {
            Ok(entry) => Some(entry),
            Err(e) => {
                tracing::warn!("ignoring unreadable cache entry {key}: {e}");
                None
            }
        }
    }

    /// Stores an entry (unless the cache is off). A failed write only logs:
    /// the reply is still good.
    pub async fn put(&self, key: &str, entry: &CachedReply) {
        if matches!(self.mode, CacheMode::Off | CacheMode::Replay) {
            return;
        }
        let Ok(bytes) = serde_json::to_vec(entry) else {
            return;
        };
        if let Err(e) = self
            .store
            .put(&self.path(key), PutPayload::from(bytes))
            .await
        {
            tracing::warn!("cannot write cache entry {key}: {e}");
        }
    }
}
