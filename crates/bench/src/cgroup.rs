//! Memory cgroups: the kernel's side of every comparison runs in one, with
//! the same memory budget as upager, so its page cache and anonymous memory
//! are reclaimed under the same pressure.
//!
//! Both cgroup versions are supported; [`MemoryHierarchy::detect`] picks
//! **v2** (the unified hierarchy, what current distributions mount alone)
//! when its memory controller is available, else **v1** (a `cgroup` mount
//! with `-o memory`, e.g. /sys/fs/cgroup/memory), else fails with
//! [`SetupError::NoMemoryCgroup`]. On a hybrid machine the memory
//! controller belongs to one of the two: a v2 hierarchy whose root
//! `cgroup.controllers` does not list `memory` cannot limit memory.
//!
//! | what                | v1                          | v2                          |
//! |---------------------|-----------------------------|-----------------------------|
//! | limit               | `memory.limit_in_bytes`     | `memory.max`                |
//! | current charge      | `memory.usage_in_bytes`     | `memory.current`            |
//! | peak charge         | `memory.max_usage_in_bytes` (write 0 resets) | `memory.peak` (a write resets it for that open file, Linux 6.12+) |
//! | page cache in `memory.stat` | `cache`             | `file`                      |
//! | pages evicted       | `pgpgout` in `memory.stat`  | (none)                      |
//! | move a process      | `cgroup.procs`              | `cgroup.procs`              |
//! | enable for children | always on                   | `+memory` in the parent's `cgroup.subtree_control` |
//!
//! Swap is not limited separately on either (v1 `memsw` and v2
//! `memory.swap.max` are left unlimited), so with a swap device on,
//! anonymous memory beyond the limit goes to swap instead of triggering the
//! OOM killer.
//!
//! v2: the cgroups are made directly below the hierarchy's root, whose
//! `cgroup.subtree_control` must include `memory` (systemd machines have it;
//! otherwise it is turned on and **left on**: turning it off again would
//! silently drop the memory limits of every other cgroup made meanwhile).
//! Writing `+memory` fails with EBUSY when the root is not the machine's
//! root cgroup and has processes of its own (a container's cgroup
//! namespace): the error says so.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::host::{
    io_err, read_trim, require_root, unique_name, write_knob, write_knob_ctx, SetupError,
};
use crate::undo::{register_undo, undo_now, Undo, UndoId};

/// Where the cgroup v1 memory controller is usually mounted.
pub const CGROUP_MEMORY_ROOT: &str = "/sys/fs/cgroup/memory";

/// A cgroup hierarchy version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CgroupVersion {
    /// The legacy per-controller hierarchies (`mount -t cgroup -o memory`).
    V1,
    /// The unified hierarchy (`mount -t cgroup2`).
    V2,
}

/// The interface files of one version (see the module's table).
struct Files {
    limit: &'static str,
    usage: &'static str,
    peak: &'static str,
    page_cache_stat: &'static str,
}

impl CgroupVersion {
    fn files(self) -> &'static Files {
        match self {
            CgroupVersion::V1 => &Files {
                limit: "memory.limit_in_bytes",
                usage: "memory.usage_in_bytes",
                peak: "memory.max_usage_in_bytes",
                page_cache_stat: "cache",
            },
            CgroupVersion::V2 => &Files {
                limit: "memory.max",
                usage: "memory.current",
                peak: "memory.peak",
                page_cache_stat: "file",
            },
        }
    }
}

/// A mounted cgroup hierarchy with the memory controller: where the runs'
/// cgroups are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryHierarchy {
    version: CgroupVersion,
    root: PathBuf,
}

impl MemoryHierarchy {
    /// The hierarchy to use on this machine: v2 if its memory controller is
    /// available, else v1 (from /proc/self/mounts).
    pub fn detect() -> Result<Self, SetupError> {
        let mounts = fs::read_to_string("/proc/self/mounts")
            .map_err(io_err("reading the mount table", "/proc/self/mounts"))?;
        Self::detect_in(&mounts)
    }

    /// [`MemoryHierarchy::detect`] over a mount table's text (the format of
    /// /proc/self/mounts); the mount points' files are read from disk.
    pub fn detect_in(mounts: &str) -> Result<Self, SetupError> {
        let all = Self::all_in(mounts);
        all.iter()
            .find(|h| h.version == CgroupVersion::V2)
            .or_else(|| all.first())
            .cloned()
            .ok_or(SetupError::NoMemoryCgroup)
    }

    /// Every mounted hierarchy with a usable memory controller, v2 first.
    pub fn all_in(mounts: &str) -> Vec<Self> {
        let mut v2 = Vec::new();
        let mut v1 = Vec::new();
        for line in mounts.lines() {
            let mut f = line.split_whitespace();
            let (Some(_dev), Some(mnt), Some(fstype), Some(opts)) =
                (f.next(), f.next(), f.next(), f.next())
            else {
                continue;
            };
            let root = PathBuf::from(mnt);
            let has_memory = match fstype {
                "cgroup2" => fs::read_to_string(root.join("cgroup.controllers"))
                    .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory")),
                "cgroup" => {
                    opts.split(',').any(|o| o == "memory")
                        && root.join(CgroupVersion::V1.files().limit).exists()
                }
                _ => false,
            };
            match (fstype, has_memory) {
                ("cgroup2", true) => v2.push(MemoryHierarchy {
                    version: CgroupVersion::V2,
                    root,
                }),
                ("cgroup", true) => v1.push(MemoryHierarchy {
                    version: CgroupVersion::V1,
                    root,
                }),
                _ => {}
            }
        }
        v2.extend(v1);
        v2
    }

    /// Every hierarchy of this machine with a memory controller (none if the
    /// mount table cannot be read).
    pub(crate) fn all() -> Vec<Self> {
        fs::read_to_string("/proc/self/mounts")
            .map(|m| Self::all_in(&m))
            .unwrap_or_default()
    }

    /// The version.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The hierarchy's root directory (the runs' cgroups are made in it).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// v2: make sure cgroups made below the root get the memory controller
    /// (`+memory` in the root's `cgroup.subtree_control`; left on, see the
    /// module doc). v1: nothing to do.
    fn enable_memory_for_children(&self) -> Result<(), SetupError> {
        if self.version == CgroupVersion::V1 {
            return Ok(());
        }
        let control = self.root.join("cgroup.subtree_control");
        let enabled = read_trim(&control)?;
        if enabled.split_whitespace().any(|w| w == "memory") {
            return Ok(());
        }
        write_knob(&control, "+memory").map_err(io_err(
            "enabling the memory controller for child cgroups (`echo +memory > cgroup.subtree_control`; \
             on cgroup v2 this fails with EBUSY while the parent cgroup has processes of its own)",
            &control,
        ))
    }

    /// Create `<root>/upager-bench-<pid>-<tag><n>` limited to `limit_bytes`
    /// (removed when the returned guard drops).
    pub fn create(&self, tag: &str, limit_bytes: u64) -> Result<Cgroup, SetupError> {
        self.create_named(&unique_name(tag), limit_bytes)
    }

    /// [`MemoryHierarchy::create`] with a given directory name; an existing
    /// directory of that name is reused.
    pub(crate) fn create_named(&self, name: &str, limit_bytes: u64) -> Result<Cgroup, SetupError> {
        self.enable_memory_for_children()?;
        let path = self.root.join(name);
        if !path.exists() {
            fs::create_dir(&path).map_err(io_err("creating the cgroup", &path))?;
        }
        let parent_procs = self.root.join("cgroup.procs");
        let undo = register_undo(Undo::new(format!("rmdir {}", path.display()), {
            let path = path.clone();
            move || {
                remove_cgroup_dir(&path, &parent_procs, Duration::from_secs(10))
                    .map_err(|e| e.to_string())
            }
        }));
        let files = self.version.files();
        // v2's peak is reset per open file: keep one open to reset and read
        // through (read-only before Linux 6.12, missing before 5.19).
        let peak_file = match self.version {
            CgroupVersion::V1 => None,
            CgroupVersion::V2 => {
                let p = path.join(files.peak);
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&p)
                    .or_else(|_| File::open(&p))
                    .ok()
            }
        };
        let cg = Cgroup {
            path,
            version: self.version,
            undo,
            peak_file,
        };
        write_knob_ctx(
            cg.path.join(files.limit),
            &limit_bytes.to_string(),
            "setting the cgroup's limit",
        )?;
        Ok(cg)
    }
}

/// A memory cgroup created for one run; removed on drop (after its tasks
/// have exited: live tasks are killed first if they were registered as
/// workers, and any task still inside after 10 s is moved to the
/// hierarchy's root).
#[derive(Debug)]
pub struct Cgroup {
    path: PathBuf,
    version: CgroupVersion,
    undo: UndoId,
    /// v2 only: `memory.peak`, kept open (its reset is per open file).
    peak_file: Option<File>,
}

impl Cgroup {
    /// Create a cgroup limited to `limit_bytes` in this machine's memory
    /// hierarchy ([`MemoryHierarchy::detect`]: v2 if it has the memory
    /// controller, else v1), named `upager-bench-<pid>-<tag><n>`.
    pub fn create(tag: &str, limit_bytes: u64) -> Result<Self, SetupError> {
        require_root("creating a memory cgroup")?;
        MemoryHierarchy::detect()?.create(tag, limit_bytes)
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its hierarchy's version.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// Move a process (all its threads) into the cgroup.
    pub fn add_pid(&self, pid: u32) -> Result<(), SetupError> {
        write_knob_ctx(
            self.path.join("cgroup.procs"),
            &pid.to_string(),
            "moving a process into the cgroup",
        )
    }

    /// Processes in the cgroup.
    pub fn procs(&self) -> Result<Vec<u32>, SetupError> {
        Ok(read_trim(self.path.join("cgroup.procs"))?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    fn read_u64(&self, file: &str) -> Result<u64, SetupError> {
        let p = self.path.join(file);
        parse_value(&read_trim(&p)?, &p)
    }

    /// The limit (`memory.limit_in_bytes` / `memory.max`; v2's `max` is
    /// `u64::MAX`).
    pub fn limit_bytes(&self) -> Result<u64, SetupError> {
        self.read_u64(self.version.files().limit)
    }
    /// The current charge (`memory.usage_in_bytes` / `memory.current`).
    pub fn usage_bytes(&self) -> Result<u64, SetupError> {
        self.read_u64(self.version.files().usage)
    }
    /// The peak charge since creation or the last
    /// [`Cgroup::reset_max_usage`] (`memory.max_usage_in_bytes` /
    /// `memory.peak`, which needs Linux 5.19).
    pub fn max_usage_bytes(&self) -> Result<u64, SetupError> {
        let files = self.version.files();
        match &self.peak_file {
            Some(f) => {
                let p = self.path.join(files.peak);
                let mut s = String::new();
                let mut f: &File = f;
                f.seek(SeekFrom::Start(0))
                    .and_then(|_| f.read_to_string(&mut s))
                    .map_err(io_err("reading", &p))?;
                parse_value(s.trim(), &p)
            }
            None => self.read_u64(files.peak),
        }
    }
    /// Reset the peak to the current charge.
    ///
    /// v2 before Linux 6.12 cannot reset `memory.peak`; then this does
    /// nothing, and the peak is the one since creation — the same number
    /// here: the cgroup is made empty for one run, and moving a process in
    /// moves none of its earlier charges.
    pub fn reset_max_usage(&self) -> Result<(), SetupError> {
        let files = self.version.files();
        match (self.version, &self.peak_file) {
            (CgroupVersion::V1, _) => {
                write_knob_ctx(self.path.join(files.peak), "0", "resetting the peak usage")
            }
            (CgroupVersion::V2, Some(f)) => {
                let mut f: &File = f;
                // Read-only before 6.12: the write fails, see above.
                let _ = f
                    .seek(SeekFrom::Start(0))
                    .and_then(|_| f.write_all(b"reset"));
                Ok(())
            }
            (CgroupVersion::V2, None) => Ok(()),
        }
    }
    /// `memory.stat` as name → value.
    pub fn stat(&self) -> Result<BTreeMap<String, u64>, SetupError> {
        Ok(parse_memory_stat(&read_trim(
            self.path.join("memory.stat"),
        )?))
    }
    /// Page cache bytes charged, from a [`Cgroup::stat`] (`cache` on v1,
    /// `file` on v2).
    pub fn page_cache_bytes(&self, stat: &BTreeMap<String, u64>) -> Option<u64> {
        stat.get(self.version.files().page_cache_stat).copied()
    }

    /// Remove the cgroup now (waits up to 10 s for its tasks to exit).
    pub fn remove(mut self) -> Result<(), SetupError> {
        self.peak_file = None;
        // Drop finds the action gone and does nothing.
        undo_now(self.undo).map_err(|e| SetupError::Tool {
            command: "rmdir cgroup".into(),
            status: "failed".into(),
            stderr: e,
        })
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.peak_file = None;
        let _ = undo_now(self.undo);
    }
}

/// A number from a cgroup file; `max` (v2's "no limit") is `u64::MAX`.
fn parse_value(s: &str, path: &Path) -> Result<u64, SetupError> {
    if s == "max" {
        return Ok(u64::MAX);
    }
    s.parse().map_err(|_| SetupError::Io {
        what: format!("parsing {s:?}"),
        path: path.to_path_buf(),
        source: io::ErrorKind::InvalidData.into(),
    })
}

/// Parse `memory.stat` (lines of `name value`; also /proc/vmstat).
pub fn parse_memory_stat(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.to_string(), f.next()?.parse().ok()?))
        })
        .collect()
}

/// rmdir a cgroup once its tasks have gone (tasks still inside after
/// `timeout`, not ours to kill, are moved to `parent_procs`).
fn remove_cgroup_dir(
    path: &Path,
    parent_procs: &Path,
    timeout: Duration,
) -> Result<(), SetupError> {
    if !path.exists() {
        return Ok(());
    }
    let start = Instant::now();
    let procs = |p: &Path| -> Vec<String> {
        fs::read_to_string(p.join("cgroup.procs"))
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    };
    while !procs(path).is_empty() && start.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Tasks still inside (not ours to kill): move them out so rmdir works.
    for p in procs(path) {
        let _ = write_knob(parent_procs, &p);
    }
    // rmdir can fail with EBUSY for a moment after the last task left.
    loop {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if start.elapsed() > timeout + Duration::from_secs(5) => {
                return Err(io_err("removing the cgroup", path)(e));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Remove the cgroups that dead benchmark processes left in every memory
/// hierarchy; returns what was removed.
pub(crate) fn remove_stale(is_stale: impl Fn(&str) -> bool) -> Vec<String> {
    let mut done = Vec::new();
    for h in MemoryHierarchy::all() {
        let Ok(rd) = fs::read_dir(&h.root) else {
            continue;
        };
        let parent_procs = h.root.join("cgroup.procs");
        for e in rd.flatten() {
            if !is_stale(&e.file_name().to_string_lossy()) || !e.path().is_dir() {
                continue;
            }
            let path = e.path();
            let u = Undo::new(format!("rmdir {}", path.display()), {
                let (path, parent_procs) = (path.clone(), parent_procs.clone());
                move || {
                    remove_cgroup_dir(&path, &parent_procs, Duration::from_secs(10))
                        .map_err(|e| e.to_string())
                }
            });
            if u.run().is_ok() {
                done.push(path.display().to_string());
            }
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_stat_parses() {
        let m = parse_memory_stat("cache 4096\nrss 8192\npgpgout 17\ntotal_pgpgout 20\nbad line\n");
        assert_eq!(m["pgpgout"], 17);
        assert_eq!(m["rss"], 8192);
        assert!(!m.contains_key("bad"));
    }

    /// A directory tree shaped like a cgroup hierarchy (the kernel makes a
    /// cgroup's interface files; here the test does), removed on drop.
    struct FakeTree(PathBuf);

    impl FakeTree {
        fn new(what: &str) -> Self {
            let root = std::env::temp_dir().join(unique_name(what));
            fs::create_dir_all(&root).unwrap();
            FakeTree(root)
        }
        fn file(&self, rel: &str, text: &str) -> PathBuf {
            let p = self.0.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, text).unwrap();
            p
        }
        fn read(&self, rel: &str) -> String {
            fs::read_to_string(self.0.join(rel)).unwrap()
        }
        /// Empty a fake cgroup directory so its rmdir works (the kernel's
        /// interface files do not keep a real one from going).
        fn empty_dir(&self, rel: &str) {
            for e in fs::read_dir(self.0.join(rel)).unwrap().flatten() {
                fs::remove_file(e.path()).unwrap();
            }
        }
    }

    impl Drop for FakeTree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn mounts(v2: &Path, v1: &Path) -> String {
        format!(
            "tmpfs /sys/fs/cgroup tmpfs rw,relatime 0 0\n\
             cgroup2 {} cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n\
             cgroup {} cgroup rw,relatime,memory 0 0\n\
             cgroup /nonexistent/cpu cgroup rw,relatime,cpu 0 0\n",
            v2.display(),
            v1.display()
        )
    }

    #[test]
    fn detection_prefers_v2_with_memory_then_v1() {
        let v2 = FakeTree::new("cg2");
        let v1 = FakeTree::new("cg1");
        v1.file("memory.limit_in_bytes", "9223372036854771712\n");
        let m = mounts(&v2.0, &v1.0);

        // A hybrid machine whose memory controller is bound to v1 (this one).
        v2.file("cgroup.controllers", "hugetlb\n");
        let h = MemoryHierarchy::detect_in(&m).unwrap();
        assert_eq!((h.version(), h.root()), (CgroupVersion::V1, v1.0.as_path()));

        // v2 with the memory controller wins.
        v2.file("cgroup.controllers", "cpuset cpu io memory hugetlb pids\n");
        let h = MemoryHierarchy::detect_in(&m).unwrap();
        assert_eq!((h.version(), h.root()), (CgroupVersion::V2, v2.0.as_path()));
        assert_eq!(MemoryHierarchy::all_in(&m).len(), 2);

        // Neither: a clear error.
        v2.file("cgroup.controllers", "cpu\n");
        fs::remove_file(v1.0.join("memory.limit_in_bytes")).unwrap();
        let e = MemoryHierarchy::detect_in(&m).unwrap_err();
        assert!(matches!(e, SetupError::NoMemoryCgroup));
        assert!(e.to_string().contains("mount -t cgroup2"), "{e}");
    }

    /// The v2 file logic against a fake tree: on this machine the memory
    /// controller is bound to v1, so no real v2 cgroup can limit memory.
    #[test]
    fn v2_files() {
        let t = FakeTree::new("cg2");
        t.file("cgroup.controllers", "cpu io memory pids\n");
        t.file("cgroup.subtree_control", "");
        t.file("cgroup.procs", "");
        let h = MemoryHierarchy::detect_in(&format!("cgroup2 {} cgroup2 rw 0 0\n", t.0.display()))
            .unwrap();
        assert_eq!(h.version(), CgroupVersion::V2);
        let name = "upager-bench-test-v2";
        for f in ["memory.max", "cgroup.procs"] {
            t.file(&format!("{name}/{f}"), "");
        }
        t.file(&format!("{name}/memory.current"), "12288\n");
        t.file(&format!("{name}/memory.peak"), "40960\n");
        t.file(
            &format!("{name}/memory.stat"),
            "anon 4096\nfile 8192\npgfault 3\npgmajfault 1\n",
        );

        let cg = h.create_named(name, 64 << 20).unwrap();
        assert_eq!(t.read("cgroup.subtree_control"), "+memory");
        assert_eq!(t.read(&format!("{name}/memory.max")), "67108864");
        assert_eq!(cg.limit_bytes().unwrap(), 64 << 20);
        assert_eq!(cg.version(), CgroupVersion::V2);

        cg.add_pid(4242).unwrap();
        assert_eq!(t.read(&format!("{name}/cgroup.procs")), "4242");
        assert_eq!(cg.procs().unwrap(), [4242]);
        assert_eq!(cg.usage_bytes().unwrap(), 12288);

        // The peak is read, reset and read again through one open file.
        assert_eq!(cg.max_usage_bytes().unwrap(), 40960);
        cg.reset_max_usage().unwrap();
        // (Written over the fake file's first bytes.)
        assert!(t.read(&format!("{name}/memory.peak")).starts_with("reset"));
        t.file(&format!("{name}/memory.peak"), "16384\n");
        assert_eq!(cg.max_usage_bytes().unwrap(), 16384);

        let stat = cg.stat().unwrap();
        assert_eq!(cg.page_cache_bytes(&stat), Some(8192));
        assert_eq!(stat["pgfault"], 3);

        t.file(&format!("{name}/memory.max"), "max\n");
        assert_eq!(cg.limit_bytes().unwrap(), u64::MAX);

        // A second cgroup: memory is already enabled for children, so the
        // parent's subtree_control is not written again.
        t.file("cgroup.subtree_control", "memory pids\n");
        let name2 = "upager-bench-test-v2b";
        t.file(&format!("{name2}/memory.max"), "");
        let cg2 = h.create_named(name2, 4096).unwrap();
        assert_eq!(t.read("cgroup.subtree_control"), "memory pids\n");

        t.empty_dir(name);
        t.empty_dir(name2);
        let path = cg.path().to_path_buf();
        drop(cg);
        cg2.remove().unwrap();
        assert!(!path.exists() && !t.0.join(name2).exists());
    }

    #[test]
    fn v2_enable_failure_is_explained() {
        let t = FakeTree::new("cg2");
        t.file("cgroup.controllers", "memory\n");
        let h = MemoryHierarchy {
            version: CgroupVersion::V2,
            root: t.0.clone(),
        };
        // A parent whose subtree_control takes no write (the kernel says
        // EBUSY when the parent has processes; /proc/version says EIO).
        std::os::unix::fs::symlink("/proc/version", t.0.join("cgroup.subtree_control")).unwrap();
        let e = h.create_named("upager-bench-test-x", 4096).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("+memory") && msg.contains("EBUSY") && msg.contains("subtree_control"),
            "{msg}"
        );
        assert!(!t.0.join("upager-bench-test-x").exists());
    }

    #[test]
    fn v1_files() {
        let t = FakeTree::new("cg1");
        t.file("memory.limit_in_bytes", "9223372036854771712\n");
        t.file("cgroup.procs", "");
        let h = MemoryHierarchy::detect_in(&format!(
            "cgroup {} cgroup rw,relatime,memory 0 0\n",
            t.0.display()
        ))
        .unwrap();
        assert_eq!(h.version(), CgroupVersion::V1);
        let name = "upager-bench-test-v1";
        for f in ["memory.limit_in_bytes", "memory.max_usage_in_bytes"] {
            t.file(&format!("{name}/{f}"), "");
        }
        t.file(&format!("{name}/memory.stat"), "cache 8192\npgpgout 5\n");
        let cg = h.create_named(name, 1 << 20).unwrap();
        assert_eq!(cg.limit_bytes().unwrap(), 1 << 20);
        cg.reset_max_usage().unwrap();
        assert_eq!(t.read(&format!("{name}/memory.max_usage_in_bytes")), "0");
        let stat = cg.stat().unwrap();
        assert_eq!(cg.page_cache_bytes(&stat), Some(8192));
        t.empty_dir(name);
        let path = cg.path().to_path_buf();
        drop(cg);
        assert!(!path.exists());
    }
}
