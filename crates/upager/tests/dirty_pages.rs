//! Dirty per 4 KiB inside a larger folio (dirty.rs): one small
//! write to a folio above 4 KiB (and below 2 MiB: a 2 MiB folio is one huge
//! page, kept whole) writes back its 4 KiB page, not the folio;
//! a second page written makes the whole folio dirty; nothing written is
//! lost either way, by flush or by eviction, through the write-protect
//! fault (the folio was read first) or the missing-write fill.

// Integration tests are a crate of their own (the lint is for unit tests).
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::Relaxed;

use common::{pattern_file, ram_dir, word};
use upager::{MapOptions, Pager, Region};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// A pattern file of `len` bytes (seed `seed`) in `dir`, mapped writable
/// with `folio` folios by a pager of `budget`.
fn mapped(
    dir: &std::path::Path,
    name: &str,
    (len, seed): (u64, u64),
    budget: u64,
    folio: u64,
) -> (std::path::PathBuf, Pager, Region) {
    let path = pattern_file(dir, name, len, seed);
    let p = Pager::builder()
        .budget(budget)
        .build()
        .expect("pager (needs /dev/userfaultfd: run as root)");
    let r = p
        .map_file(&path, &MapOptions::new().writable(true).folio(folio))
        .unwrap();
    (path, p, r)
}

/// The word at byte `off` of the file.
fn file_word(file: &std::fs::File, off: u64) -> u64 {
    let mut b = [0u8; 8];
    file.read_exact_at(&mut b, off).unwrap();
    u64::from_ne_bytes(b)
}

/// Whole file against the pattern, but for `written` (offset, value).
fn check_file(path: &std::path::Path, len: u64, seed: u64, written: &[(u64, u64)]) {
    let data = std::fs::read(path).unwrap();
    assert_eq!(data.len() as u64, len);
    for (i, chunk) in data.chunks_exact(8).enumerate() {
        let off = i as u64 * 8;
        let want = written
            .iter()
            .rev()
            .find(|w| w.0 == off)
            .map_or_else(|| word(off, seed), |w| w.1);
        let got = u64::from_ne_bytes(chunk.try_into().unwrap());
        assert_eq!(got, want, "word at byte {off}");
    }
}

#[test]
fn a_small_write_writes_back_its_page_whatever_the_folio() {
    let dir = ram_dir();
    for folio in [8 << 10, 64 << 10, MIB] {
        let len = 16 * MIB;
        // Room for both folios under the dirty limit (half the budget): no
        // write-back before the flush.
        let (path, p, r) = mapped(
            dir.path(),
            &format!("data{folio}"),
            (len, 11),
            32 * MIB,
            folio,
        );
        let per = (folio / PAGE) as usize;
        let mut written = Vec::new();
        // Folio 1: read first (CLEAN, write-protected), then one word in its
        // last page: the write-protect fault. Folio 3: never touched, one
        // word in its middle page: the missing-write fill.
        let a = folio + (per as u64 - 1) * PAGE + 24;
        assert_eq!(
            r.words()[(folio / 8) as usize].load(Relaxed),
            word(folio, 11)
        );
        let b = 3 * folio + (per as u64 / 2) * PAGE + 8;
        for (k, &off) in [a, b].iter().enumerate() {
            let v = 0xd1d1_0000 + k as u64;
            r.words()[(off / 8) as usize].store(v, Relaxed);
            written.push((off, v));
        }
        // The rest of both folios reads as before (nothing was zeroed).
        for base in [folio, 3 * folio] {
            for pg in 0..per as u64 {
                let off = base + pg * PAGE;
                if written.iter().all(|w| w.0 != off) {
                    assert_eq!(r.words()[(off / 8) as usize].load(Relaxed), word(off, 11));
                }
            }
        }
        let before = p.stats();
        r.flush().unwrap();
        let s = p.stats();
        assert_eq!(
            (
                s.writebacks - before.writebacks,
                s.bytes_written - before.bytes_written
            ),
            (2, 2 * PAGE),
            "folio {folio}: two 8-byte writes should write back two 4 KiB pages: {s:?}"
        );
        r.unmap().unwrap();
        check_file(&path, len, 11, &written);
    }
}

#[test]
fn a_second_page_written_dirties_the_whole_folio() {
    let dir = ram_dir();
    let len = 8 * MIB;
    let folio = 64 << 10;
    let (path, p, r) = mapped(dir.path(), "data", (len, 12), 4 * MIB, folio);
    // Two pages of folio 5 (missing-write fill, then a write-protect fault
    // on the DIRTY|PARTIAL folio), and two pages of folio 9 read first.
    let _ = r.words()[(9 * folio / 8) as usize].load(Relaxed);
    let mut written = Vec::new();
    for (k, off) in [
        5 * folio + 3 * PAGE,
        5 * folio + 9 * PAGE + 16,
        9 * folio,
        9 * folio + 15 * PAGE,
    ]
    .into_iter()
    .enumerate()
    {
        let v = 0xabcd_0000 + k as u64;
        r.words()[(off / 8) as usize].store(v, Relaxed);
        written.push((off, v));
    }
    // And after its first page went back, a later write to another page.
    r.flush().unwrap();
    let s0 = p.stats();
    assert_eq!(s0.bytes_written, 2 * folio, "{s0:?}");
    let off = 5 * folio + 12 * PAGE;
    r.words()[(off / 8) as usize].store(77, Relaxed);
    written.push((off, 77));
    r.flush().unwrap();
    let s1 = p.stats();
    assert_eq!(s1.bytes_written - s0.bytes_written, PAGE, "{s1:?}");
    r.unmap().unwrap();
    check_file(&path, len, 12, &written);
}

#[test]
fn pages_written_in_part_survive_eviction() {
    // One word in a different page of every folio, through a budget an
    // eighth of the region: eviction writes them back, a page each, and
    // every write is in the file after the unmap.
    let dir = ram_dir();
    let len = 64 * MIB;
    let folio = 64 << 10;
    let (path, p, r) = mapped(dir.path(), "data", (len, 13), 8 * MIB, folio);
    let per = folio / PAGE;
    let n = len / folio;
    let mut written = Vec::new();
    for i in 0..n {
        // Every third folio read before it is written (write-protect path).
        if i % 3 == 0 {
            let _ = r.words()[(i * folio / 8) as usize + 1].load(Relaxed);
        }
        let off = i * folio + (i * 7 % per) * PAGE + 8 * (i % 512);
        let v = 0x5eed_0000_0000 + i;
        r.words()[(off / 8) as usize].store(v, Relaxed);
        written.push((off, v));
    }
    // Read them back through the region (most were evicted and refault).
    for &(off, v) in &written {
        assert_eq!(r.words()[(off / 8) as usize].load(Relaxed), v, "at {off}");
    }
    r.flush().unwrap();
    let s = p.stats();
    assert!(s.evictions > n / 2, "{s:?}");
    // Every write-back was one page. (A page may go back twice: the dirty
    // limit writes back a folio in part while its writer is between two
    // stores of the same page.)
    assert_eq!(s.bytes_written, s.writebacks * PAGE, "{s:?}");
    assert!(
        (n * PAGE..=n * PAGE * 11 / 10).contains(&s.bytes_written),
        "about one page per folio: {s:?}"
    );
    r.unmap().unwrap();
    check_file(&path, len, 13, &written);
    let f = std::fs::File::open(&path).unwrap();
    assert_eq!(file_word(&f, written[7].0), written[7].1);
}

#[test]
fn a_write_pin_makes_the_whole_folio_writable() {
    // A write pin promises writable memory (a system call may write it in
    // the in-thread mode, where a protected page gives EFAULT): a folio
    // dirty in part is unprotected whole, and written back whole.
    let dir = ram_dir();
    let len = 4 * MIB;
    let folio = 64 << 10;
    let (path, p, r) = mapped(dir.path(), "data", (len, 14), 2 * MIB, folio);
    r.words()[(2 * folio / 8) as usize + 3].store(1, Relaxed);
    r.pin(2 * folio, folio, true).unwrap();
    // A pread into the pinned folio's last page: a system call writing it.
    let src = std::fs::File::open(&path).unwrap();
    let dst = &r.bytes()[(2 * folio + folio - PAGE) as usize..(3 * folio) as usize];
    // SAFETY: the slice is region memory, pinned resident and writable;
    // AtomicU8 has the layout of u8.
    let buf = unsafe { std::slice::from_raw_parts_mut(dst.as_ptr() as *mut u8, PAGE as usize) };
    src.read_exact_at(buf, 0).unwrap();
    r.unpin(2 * folio, folio).unwrap();
    let before = p.stats().bytes_written;
    r.flush().unwrap();
    assert_eq!(p.stats().bytes_written - before, folio);
    let mut written = vec![(2 * folio + 24, 1)];
    for k in 0..PAGE / 8 {
        written.push((3 * folio - PAGE + k * 8, word(k * 8, 14)));
    }
    r.unmap().unwrap();
    check_file(&path, len, 14, &written);
}

/// A file store whose writes fail while `failing` is set.
#[derive(Debug)]
struct Failing {
    inner: upager::FileStore,
    failing: std::sync::atomic::AtomicBool,
}

impl upager::Store for Failing {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn writable(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_from(&self, src: upager::Src<'_>, offset: u64) -> std::io::Result<()> {
        if self.failing.load(Relaxed) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.write_from(src, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }
    fn takes_pages(&self) -> bool {
        true
    }
}

#[test]
fn a_failed_write_back_keeps_the_written_page_dirty() {
    // A folio dirty in part whose write-back fails stays dirty and keeps
    // its page (written alone once the store recovers); one written again
    // after the failure (the failed batch protected it whole) becomes
    // wholly dirty. Nothing written is lost either way.
    let dir = ram_dir();
    let (len, folio) = (4 * MIB, 64 << 10);
    let path = pattern_file(dir.path(), "data", len, 15);
    let store = std::sync::Arc::new(Failing {
        inner: upager::FileStore::open(&path, true, true).unwrap(),
        failing: std::sync::atomic::AtomicBool::new(false),
    });
    let p = Pager::builder().budget(16 * MIB).build().unwrap();
    let r = p
        .map_store(
            store.clone(),
            &MapOptions::new().writable(true).folio(folio),
        )
        .unwrap();
    let mut written = vec![(2 * folio + 3 * PAGE + 8, 21), (5 * folio + 9 * PAGE, 51)];
    for &(off, v) in &written {
        r.words()[(off / 8) as usize].store(v, Relaxed);
    }
    store.failing.store(true, Relaxed);
    assert!(r.flush().is_err(), "the store refuses writes");
    for f in [2, 5] {
        assert_eq!(
            r.residency(f * folio, folio).unwrap()[0].1,
            upager::Residency::ResidentDirty,
            "folio {f}"
        );
    }
    // Folio 2 again: the same page, then another one.
    for (off, v) in [(2 * folio + 3 * PAGE + 16, 22), (2 * folio + 12 * PAGE, 23)] {
        r.words()[(off / 8) as usize].store(v, Relaxed);
        written.push((off, v));
    }
    store.failing.store(false, Relaxed);
    let before = p.stats().bytes_written;
    // The first flush after the failure may report it once (as fsync does).
    if r.flush().is_err() {
        r.flush().unwrap();
    }
    assert_eq!(
        p.stats().bytes_written - before,
        folio + PAGE,
        "folio 2 whole, folio 5's page alone"
    );
    r.unmap().unwrap();
    check_file(&path, len, 15, &written);
}
