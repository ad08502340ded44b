//! `/proc/self/pagemap` and the `PAGEMAP_SCAN` ioctl (Linux 6.7; `ENOTTY`
//! before, as when [masked](crate::features) for tests).
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use linux_raw_sys::general as k;

use crate::{cvt, ioc, IOC_READ_WRITE, PAGE_SIZE};

/// `PAGEMAP_SCAN` = `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: u32 = ioc(IOC_READ_WRITE, b'f' as u32, 16, size_of::<k::pm_scan_arg>());

/// pagemap bit 63: page present in RAM.
pub const PM_PRESENT: u64 = 1 << 63;
/// pagemap bit 62: page swapped out.
pub const PM_SWAPPED: u64 = 1 << 62;

/// PAGEMAP_SCAN category bits.
pub mod category {
    use linux_raw_sys::general as k;
    /// Page is present.
    pub const PRESENT: u64 = k::PAGE_IS_PRESENT as u64;
    /// Page is swapped.
    pub const SWAPPED: u64 = k::PAGE_IS_SWAPPED as u64;
    /// Page was written since write protection (uffd-wp) was set.
    pub const WRITTEN: u64 = k::PAGE_IS_WRITTEN as u64;
    /// Page is part of a huge page (PMD-mapped THP or hugetlb).
    pub const HUGE: u64 = k::PAGE_IS_HUGE as u64;
}

/// Whether the `PAGEMAP_SCAN` ioctl works here (Linux 6.7; not
/// [masked](crate::features)): one scan of an empty range.
pub fn scan_available() -> bool {
    let Ok(pagemap) = File::open("/proc/self/pagemap") else {
        return false;
    };
    let probe = [0u8; PAGE_SIZE];
    let addr = probe.as_ptr() as u64 & !(PAGE_SIZE as u64 - 1);
    scan_runs::<1>(&pagemap, addr, PAGE_SIZE as u64, category::PRESENT).is_ok()
}

/// Runs of pages `(start, end)` found by [`scan_runs`]: the first `n` are
/// filled; `complete` if the walk reached the end of the range.
struct Runs<const N: usize> {
    runs: [(u64, u64); N],
    n: usize,
    complete: bool,
}

/// `PAGEMAP_SCAN` of `[addr, addr + len)` into at most `N` runs on the
/// stack, of pages in all of the `mask` categories. Allocates nothing
/// (async-signal-safe).
fn scan_runs<const N: usize>(
    pagemap: &File,
    addr: u64,
    len: u64,
    mask: u64,
) -> io::Result<Runs<N>> {
    if crate::features::masked(crate::features::Feature::PagemapScan) {
        return Err(io::Error::from_raw_os_error(libc::ENOTTY));
    }
    let mut vec = [k::page_region {
        start: 0,
        end: 0,
        categories: 0,
    }; N];
    let mut arg = k::pm_scan_arg {
        size: size_of::<k::pm_scan_arg>() as u64,
        flags: 0,
        start: addr,
        end: addr + len,
        walk_end: 0,
        vec: vec.as_mut_ptr() as u64,
        vec_len: N as u64,
        max_pages: 0,
        category_inverted: 0,
        category_mask: mask,
        category_anyof_mask: 0,
        return_mask: mask,
    };
    // SAFETY: `arg` is a valid pm_scan_arg whose `vec` points at N live
    // page_region entries on this stack that the kernel fills; the scanned
    // range is only inspected.
    let n = cvt(unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) }.into())?
        as usize;
    let n = n.min(N);
    let mut runs = [(0, 0); N];
    for (o, r) in runs.iter_mut().zip(&vec[..n]) {
        *o = (r.start, r.end);
    }
    Ok(Runs {
        runs,
        n,
        complete: arg.walk_end >= addr + len,
    })
}

/// Whether all of `[addr, addr + len)` is present and mapped by huge pages
/// (`PAGEMAP_SCAN`). Allocates nothing (async-signal-safe).
pub fn is_huge(pagemap: &File, addr: u64, len: u64) -> io::Result<bool> {
    let r = scan_runs::<2>(pagemap, addr, len, category::PRESENT | category::HUGE)?;
    Ok(r.n == 1 && r.runs[0] == (addr, addr + len))
}

/// Most runs of present pages [`present_runs`] reports.
pub const PRESENT_RUNS: usize = 8;

/// The runs of present pages in `[addr, addr + len)` (`PAGEMAP_SCAN`),
/// as `(start, end)` addresses in order, into `out`; returns how many, or
/// `None` if there are more than [`PRESENT_RUNS`]. Allocates nothing
/// (async-signal-safe).
pub fn present_runs(
    pagemap: &File,
    addr: u64,
    len: u64,
    out: &mut [(u64, u64); PRESENT_RUNS],
) -> io::Result<Option<usize>> {
    let r = scan_runs::<PRESENT_RUNS>(pagemap, addr, len, category::PRESENT)?;
    if r.n == PRESENT_RUNS && !r.complete {
        return Ok(None);
    }
    *out = r.runs;
    Ok(Some(r.n))
}

/// Reads `/proc/self/pagemap` entries for `[addr, addr+len)` into `out` (one
/// u64 per 4 KiB page), one pread.
pub fn read_pagemap(pagemap: &File, addr: u64, len: u64, out: &mut Vec<u64>) -> io::Result<()> {
    let pages = len.div_ceil(PAGE_SIZE as u64) as usize;
    let mut bytes = vec![0u8; pages * 8];
    let off = addr / PAGE_SIZE as u64 * 8;
    pagemap.read_exact_at(&mut bytes, off)?;
    out.clear();
    out.extend(
        bytes
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes"))),
    );
    Ok(())
}

/// One region returned by PAGEMAP_SCAN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScanRegion {
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Category bits (see [`category`]).
    pub categories: u64,
}

/// `PAGEMAP_SCAN` of `[start, end)` on a `/proc/self/pagemap` fd: fills `out`
/// with runs of pages whose categories match `required` (all of) and returns
/// the address where the walk ended (resume from there if it is < `end`).
pub fn pagemap_scan(
    pagemap: &File,
    start: u64,
    end: u64,
    required: u64,
    return_mask: u64,
    out: &mut Vec<ScanRegion>,
) -> io::Result<u64> {
    if crate::features::masked(crate::features::Feature::PagemapScan) {
        return Err(io::Error::from_raw_os_error(libc::ENOTTY));
    }
    let cap = out.capacity().max(1024);
    let mut vec = vec![
        k::page_region {
            start: 0,
            end: 0,
            categories: 0
        };
        cap
    ];
    let mut arg = k::pm_scan_arg {
        size: size_of::<k::pm_scan_arg>() as u64,
        flags: 0,
        start,
        end,
        walk_end: 0,
        vec: vec.as_mut_ptr() as u64,
        vec_len: cap as u64,
        max_pages: 0,
        category_inverted: 0,
        category_mask: required,
        category_anyof_mask: 0,
        return_mask,
    };
    // SAFETY: `arg` is a valid pm_scan_arg whose `vec` points at `cap` live
    // page_region entries that the kernel fills; the scanned range is only
    // inspected, never written.
    let n = cvt(unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) }.into())?
        as usize;
    out.clear();
    out.extend(vec[..n].iter().map(|r| ScanRegion {
        start: r.start,
        end: r.end,
        categories: r.categories,
    }));
    Ok(arg.walk_end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::AlignedBuf;

    #[test]
    fn present_runs_lists_the_touched_pages_in_order() {
        let Ok(pm) = File::open("/proc/self/pagemap") else {
            return; // no procfs here
        };
        let page = PAGE_SIZE;
        let mut buf = AlignedBuf::zeroed(16 * page);
        let base = buf.addr();
        let len = 16 * page as u64;
        assert_eq!(
            present_runs(&pm, base, len, &mut [(0, 0); PRESENT_RUNS]).unwrap(),
            Some(0)
        );
        for p in [0, 1, 5, 15] {
            buf[p * page] = 1;
        }
        let mut runs = [(0, 0); PRESENT_RUNS];
        let p = page as u64;
        assert_eq!(present_runs(&pm, base, len, &mut runs).unwrap(), Some(3));
        assert_eq!(
            runs[..3],
            [
                (base, base + 2 * p),
                (base + 5 * p, base + 6 * p),
                (base + 15 * p, base + 16 * p)
            ]
        );
        // More runs than it reports: None.
        let mut many = AlignedBuf::zeroed(32 * page);
        for k in (0..32).step_by(2) {
            many[k * page] = 1;
        }
        let m = many.addr();
        assert_eq!(present_runs(&pm, m, 32 * p, &mut runs).unwrap(), None);
        assert_eq!(present_runs(&pm, m, 16 * p, &mut runs).unwrap(), Some(8));
    }
}
