//! Multi-size THP (mTHP) knobs: which anonymous folio sizes the kernel
//! offers, enabling exactly one for a run ([`ThpKnobs`], restored on drop),
//! and the per-size fault counters that show it was used.

use std::fs;
use std::path::PathBuf;

use crate::host::{read_trim, require_root, write_knob, write_knob_ctx, SetupError};
use crate::undo::{register_undo, undo_now, Undo, UndoId};

/// Anonymous mTHP sizes (KiB) this kernel offers, smallest first: the
/// /sys/kernel/mm/transparent_hugepage/hugepages-*kB directories that have an
/// `enabled` file (some sizes, e.g. 8 KiB, exist for shmem only).
pub fn mthp_sizes_kb() -> Vec<u64> {
    let mut v: Vec<u64> = fs::read_dir("/sys/kernel/mm/transparent_hugepage")
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().join("enabled").exists())
                .filter_map(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .strip_prefix("hugepages-")
                        .and_then(|s| s.strip_suffix("kB"))
                        .and_then(|s| s.parse().ok())
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// The selected word of a sysfs choice file (`always [madvise] never`).
pub fn parse_sysfs_choice(text: &str) -> Option<String> {
    let s = text.find('[')?;
    let e = text[s..].find(']')?;
    Some(text[s + 1..s + e].to_string())
}

impl Undo {
    /// Write a saved value back to a sysfs knob.
    pub(crate) fn restore_knob(path: PathBuf, value: String) -> Self {
        Undo::new(format!("restore {} = {value}", path.display()), move || {
            write_knob(&path, &value)
                .map_err(|e| format!("restore {} = {value}: {e}", path.display()))
        })
    }
}

/// Per-size mTHP settings changed for one run; restored on drop.
#[derive(Debug)]
pub struct ThpKnobs {
    undos: Vec<UndoId>,
}

impl ThpKnobs {
    /// Set `hugepages-<size_kb>kB/enabled` to `always` and every other size to
    /// `never`, so anonymous faults allocate exactly that folio size where
    /// alignment allows (the kernel tries the largest enabled size first).
    pub fn only(size_kb: u64) -> Result<Self, SetupError> {
        require_root("changing the mTHP settings")?;
        let sizes = mthp_sizes_kb();
        if !sizes.contains(&size_kb) {
            return Err(SetupError::NoThpSize { size_kb });
        }
        let mut k = ThpKnobs { undos: Vec::new() };
        for s in sizes {
            let p = PathBuf::from(format!(
                "/sys/kernel/mm/transparent_hugepage/hugepages-{s}kB/enabled"
            ));
            let cur = parse_sysfs_choice(&read_trim(&p)?).unwrap_or_else(|| "never".into());
            let want = if s == size_kb { "always" } else { "never" };
            if cur != want {
                k.undos
                    .push(register_undo(Undo::restore_knob(p.clone(), cur)));
                write_knob_ctx(&p, want, "setting an mTHP size")?;
            }
        }
        Ok(k)
    }
}

impl Drop for ThpKnobs {
    fn drop(&mut self) {
        while let Some(u) = self.undos.pop() {
            let _ = undo_now(u);
        }
    }
}

/// `anon_fault_alloc` and `anon_fault_fallback` of one mTHP size (counts of
/// large folios allocated at fault time, and of fallbacks to smaller ones).
pub fn mthp_fault_stats(size_kb: u64) -> Option<(u64, u64)> {
    let d = format!("/sys/kernel/mm/transparent_hugepage/hugepages-{size_kb}kB/stats");
    let r = |f: &str| {
        fs::read_to_string(format!("{d}/{f}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some((r("anon_fault_alloc")?, r("anon_fault_fallback")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_choice_parses() {
        assert_eq!(
            parse_sysfs_choice("always inherit madvise [never]").as_deref(),
            Some("never")
        );
        assert_eq!(
            parse_sysfs_choice("always [madvise] never\n").as_deref(),
            Some("madvise")
        );
        assert_eq!(parse_sysfs_choice("nothing"), None);
    }
}
