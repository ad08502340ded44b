//! The stores a pager's regions share ([`Shares`]): one file store per
//! distinct file, one swap file with one slot allocator per folio size, and
//! one pool of write-back rings, all held weakly so each closes with the
//! last region using it. Lock order: `swap` before `rings` (a new swap
//! file takes the rings under the swap lock); `files` and `rings` are never
//! held together.
//!
//! Uses: `file_store`, `rings`, `store`, `swap`.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, Weak};

use crate::file_store::FileStore;
use crate::rings::RingPool;
use crate::store::Store;
use crate::swap::{Slots, SwapFile};

/// A swap file and its slots, held weakly.
type SwapSpace = (Weak<SwapFile>, Weak<Slots>);

/// The stores a pager's regions share: one per distinct file (device,
/// inode, writable; while its size is unchanged), and one swap file with one
/// slot allocator per folio size for anonymous regions. Held weakly: a store
/// closes with the last region using it.
#[derive(Default)]
pub(crate) struct Shares {
    files: Mutex<HashMap<(u64, u64, bool), Weak<FileStore>>>,
    swap: Mutex<HashMap<u64, SwapSpace>>,
    /// The write-back rings every store of the pager uses; held by the
    /// stores, so the rings close with the last of them.
    rings: Mutex<Weak<RingPool>>,
}

impl Shares {
    /// The store of a file some live region maps already, if its size is
    /// still the one the store knows (a read-only mapping may use a
    /// writable store).
    pub fn file(&self, meta: &std::fs::Metadata, writable: bool) -> Option<Arc<dyn Store>> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        let keys: &[bool] = if writable { &[true] } else { &[false, true] };
        keys.iter().find_map(|&w| {
            let st = files.get(&(meta.dev(), meta.ino(), w))?.upgrade()?;
            // A block device's st_size is 0: shared by identity alone.
            let same_len = st.len() == meta.len() || meta.file_type().is_block_device();
            same_len.then_some(st as Arc<dyn Store>)
        })
    }

    /// The pager's ring pool (a new one if no store holds it).
    fn rings(&self) -> Arc<RingPool> {
        let mut w = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        w.upgrade().unwrap_or_else(|| {
            let pool = Arc::<RingPool>::default();
            *w = Arc::downgrade(&pool);
            pool
        })
    }

    /// Records a newly opened file store for sharing (it takes the pager's
    /// write-back rings).
    pub fn add_file(
        &self,
        meta: &std::fs::Metadata,
        writable: bool,
        mut store: FileStore,
    ) -> Arc<dyn Store> {
        use std::os::unix::fs::MetadataExt;
        store.rings = self.rings();
        let store = Arc::new(store);
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        files.retain(|_, w| w.strong_count() > 0);
        files.insert((meta.dev(), meta.ino(), writable), Arc::downgrade(&store));
        store
    }

    /// The swap file and slots of anonymous regions with `folio`-sized
    /// folios, made by `create` for the first of them.
    pub fn swap(
        &self,
        folio: u64,
        create: impl FnOnce() -> io::Result<SwapFile>,
    ) -> io::Result<(Arc<dyn Store>, Arc<Slots>)> {
        let mut swap = self.swap.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((f, s)) = swap.get(&folio) {
            if let (Some(f), Some(s)) = (f.upgrade(), s.upgrade()) {
                return Ok((f, s));
            }
        }
        let mut file = create()?;
        file.rings = self.rings();
        let (file, slots) = (Arc::new(file), Arc::new(Slots::default()));
        swap.insert(folio, (Arc::downgrade(&file), Arc::downgrade(&slots)));
        Ok((file, slots))
    }
}
