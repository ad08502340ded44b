//! Helpers shared by the integration tests: pattern files, stores that fail
//! or block on demand, child processes, and a TLB-shootdown counter.
#![allow(dead_code)]

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use upager::{FileStore, Src, Store};

/// The word stored at byte offset `off` of a pattern file made with `seed`
/// (`(off ^ seed) * GOLDEN`, see `upager_testdata::word`).
pub use upager_testdata::mul_word as word;

/// Writes `dir/name`: `len` bytes (rounded up to whole words) of pattern
/// words ([`word`] with `seed`).
pub fn pattern_file(dir: &Path, name: &str, len: u64, seed: u64) -> PathBuf {
    let path = dir.join(name);
    upager_testdata::write_file(&path, len.div_ceil(8) * 8, |off| word(off, seed)).unwrap();
    path
}

/// A directory on RAM-backed storage (tmpfs) for test data.
pub fn ram_dir() -> tempfile::TempDir {
    // A child process (run_child, ChildProc) may die by a signal or exit(),
    // so it never removes its own directory: it works inside one that its
    // parent created and removes.
    let base = match std::env::var_os(PARENT_DIR_ENV) {
        Some(d) => PathBuf::from(d),
        None if Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
        None => PathBuf::from("/tmp"),
    };
    tempfile::Builder::new()
        .prefix("upager-test")
        .tempdir_in(base)
        .unwrap()
}

/// Names the directory a parent test made for its child process's files.
const PARENT_DIR_ENV: &str = "UPAGER_TEST_PARENT_DIR";

/// A directory for a child process's files, removed by the parent (the
/// child may run as another user, so anyone may create entries in it, as
/// in /tmp).
fn child_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = ram_dir();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    d
}

/// A file store that fails chosen reads/writes, or blocks reads at a gate.
#[derive(Debug)]
pub struct TestStore {
    pub inner: FileStore,
    /// Fail reads that touch this byte offset (u64::MAX: none).
    pub fail_read_at: AtomicU64,
    pub fail_writes: AtomicBool,
    pub gate_closed: Mutex<bool>,
    pub gate: Condvar,
    pub reads_blocked: AtomicU64,
    /// Every read call (counted on entry).
    pub reads: AtomicU64,
    /// Each read sleeps this long first (a slow disk); 0: none.
    pub read_delay_us: AtomicU64,
    pub writes: AtomicU64,
}

impl TestStore {
    pub fn new(path: &Path, writable: bool) -> TestStore {
        TestStore {
            inner: FileStore::open(path, writable, false).unwrap(),
            fail_read_at: AtomicU64::new(u64::MAX),
            fail_writes: AtomicBool::new(false),
            gate_closed: Mutex::new(false),
            gate: Condvar::new(),
            reads_blocked: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            read_delay_us: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        }
    }
    pub fn set_gate(&self, closed: bool) {
        *self.gate_closed.lock().unwrap() = closed;
        self.gate.notify_all();
    }
}

impl Store for TestStore {
    fn describe(&self) -> String {
        format!("test store over {}", self.inner.describe())
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn writable(&self) -> bool {
        self.inner.writable()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let delay = self.read_delay_us.load(Ordering::SeqCst);
        if delay > 0 {
            // The simulated latency of a slow disk, not a wait for anything.
            std::thread::sleep(Duration::from_micros(delay));
        }
        let bad = self.fail_read_at.load(Ordering::SeqCst);
        if (offset..offset + buf.len() as u64).contains(&bad) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let mut g = self.gate_closed.lock().unwrap();
        if *g {
            self.reads_blocked.fetch_add(1, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(20);
            while *g && Instant::now() < deadline {
                g = self
                    .gate
                    .wait_timeout(g, Duration::from_millis(50))
                    .unwrap()
                    .0;
            }
        }
        drop(g);
        self.inner.read_at(buf, offset)
    }
    fn write_from(&self, src: Src<'_>, offset: u64) -> io::Result<()> {
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.write_from(src, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
}

/// Polls `done` every millisecond until it holds; fails the test after
/// `secs` seconds naming `what` (no wait in a test is unbounded).
#[track_caller]
pub fn wait_until(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        // The poll interval of this bounded wait.
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether the tests run under CI (`CI=true` in the environment), where
/// every test must really run.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A test, or part of one, cannot run here: `missing` says what is missing
/// (root, tracefs, a tmpfs mount, a tool). Under `CI=true` this fails the
/// test, so CI never reports green for a test that did not run; elsewhere
/// it prints `skipping: <missing>` and the caller skips.
#[track_caller]
pub fn skip_or_fail(missing: &str) {
    if in_ci() {
        panic!("{missing} (under CI=true a test that cannot run fails instead of skipping)");
    }
    eprintln!("skipping: {missing}");
}

/// Thread ids of this process whose name (`comm`) starts with `prefix`.
pub fn threads_named(prefix: &str) -> Vec<u32> {
    my_tids()
        .into_iter()
        .filter(|t| {
            std::fs::read_to_string(format!("/proc/self/task/{t}/comm"))
                .is_ok_and(|c| c.starts_with(prefix))
        })
        .collect()
}

/// Whether thread `tid` of this process is asleep in the kernel (state `S`
/// or `D`: blocked on a lock, a condition, a sleep, a poll or a page
/// fault). False while it runs, and once it has exited.
pub fn thread_sleeping(tid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).is_ok_and(|s| {
        // "pid (comm) S ...": the comm may hold spaces and parentheses.
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| matches!(rest.trim_start().chars().next(), Some('S' | 'D')))
    })
}

/// Runs `f` on a new thread and returns its handle once that thread is
/// asleep inside `f` (see [`thread_sleeping`]): a call that blocks, seen
/// blocking. Fails the test if it does not block within `secs` seconds
/// (or returns first).
#[track_caller]
pub fn spawn_until_blocked<T: Send + 'static>(
    what: &str,
    secs: u64,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        tx.send(upager_sys::io::gettid()).unwrap();
        f()
    });
    let tid = rx
        .recv_timeout(Duration::from_secs(secs))
        .expect("the thread started");
    wait_until(&format!("{what} to block"), secs, || {
        assert!(!h.is_finished(), "{what} returned instead of blocking");
        thread_sleeping(tid)
    });
    h
}

/// Runs this test binary's `child_main` test with `UPAGER_CHILD=scenario`,
/// killing it after `timeout`.
pub fn run_child(scenario: &str, wrap: &[&str], timeout: Duration) -> Output {
    run_child_env(scenario, wrap, &[], timeout)
}

/// [`run_child`] with extra environment variables for the child.
pub fn run_child_env(
    scenario: &str,
    wrap: &[&str],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Output {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = if wrap.is_empty() {
        Command::new(&exe)
    } else {
        let mut c = Command::new(wrap[0]);
        c.args(&wrap[1..]).arg(&exe);
        c
    };
    let dir = child_dir();
    let mut child = cmd
        .args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
        .env("UPAGER_CHILD", scenario)
        .env(PARENT_DIR_ENV, dir.path())
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "child {scenario} timed out; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // The poll interval of this bounded wait for the child's exit.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Counts `tlb:tlb_flush` events with reason "remote ipi send" (the sender
/// side of a shootdown) raised by a set of threads, through a private tracefs
/// instance (so concurrent users of tracing are not disturbed).
pub struct TlbTrace {
    dir: PathBuf,
}

impl TlbTrace {
    /// None (with a message; a failure under `CI=true`: see
    /// [`skip_or_fail`]) when tracefs is not available (not root).
    #[track_caller]
    pub fn start(tids: &[u32]) -> Option<TlbTrace> {
        let root = Path::new("/sys/kernel/tracing");
        if !root.join("instances").is_dir() {
            // Not mounted yet on a fresh machine: mount it (root only).
            let _ = Command::new("mount")
                .args(["-t", "tracefs", "nodev"])
                .arg(root)
                .status();
        }
        if !root.join("instances").is_dir() {
            skip_or_fail(&format!(
                "no tracefs at {} to count shootdowns (mounting it needs root)",
                root.display()
            ));
            return None;
        }
        let dir = root.join(format!("instances/upager-test-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        if let Err(e) = std::fs::create_dir(&dir) {
            skip_or_fail(&format!(
                "no tracefs instance to count shootdowns: creating {} failed: {e}",
                dir.display()
            ));
            return None;
        }
        let pids: Vec<String> = tids.iter().map(|t| format!("common_pid == {t}")).collect();
        let filter = format!("reason == 4 && ({})", pids.join(" || "));
        std::fs::write(dir.join("buffer_size_kb"), "8192").unwrap();
        std::fs::write(dir.join("events/tlb/tlb_flush/filter"), filter).unwrap();
        std::fs::write(dir.join("events/tlb/tlb_flush/enable"), "1").unwrap();
        std::fs::write(dir.join("tracing_on"), "1").unwrap();
        Some(TlbTrace { dir })
    }

    /// Stops tracing and returns the number of IPI sends counted.
    pub fn stop(self) -> u64 {
        std::fs::write(self.dir.join("tracing_on"), "0").unwrap();
        let text = std::fs::read_to_string(self.dir.join("trace")).unwrap();
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains("tlb_flush:"))
            .count() as u64
    }
}

impl Drop for TlbTrace {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("tracing_on"), "0");
        let _ = std::fs::write(self.dir.join("events/tlb/tlb_flush/enable"), "0");
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A thread pinned to CPU 1 that spins until dropped, while the caller is
/// pinned to CPU 0: the address space stays live on the other CPU, so every
/// TLB flush of ours must interrupt it (a remote shootdown to count).
pub struct Spinner {
    stop: std::sync::Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spinner {
    pub fn start() -> Spinner {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let _ = upager_sys::io::pin_to_cpu(1);
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let _ = upager_sys::io::pin_to_cpu(0);
        Spinner {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Thread ids of this process.
pub fn my_tids() -> Vec<u32> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Resident 4 KiB pages of `[addr, addr+len)`, from the kernel (mincore).
pub fn resident_pages(addr: u64, len: u64) -> u64 {
    upager_sys::mem::mincore(addr, len)
        .unwrap()
        .iter()
        .filter(|&&b| b & 1 != 0)
        .count() as u64
}

// ---- Added for the reliability tests. ----

/// A child process running this test binary's `child_main` with
/// `UPAGER_CHILD=scenario`, whose stdout lines the parent reads as they come
/// (every wait bounded).
pub struct ChildProc {
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// Every stdout line received so far.
    pub seen: Vec<String>,
    /// The child's files; removed after the child is reaped (fields drop
    /// after `Drop::drop`).
    _dir: tempfile::TempDir,
}

impl ChildProc {
    /// Starts `scenario` with extra environment variables.
    pub fn spawn(scenario: &str, envs: &[(&str, &str)]) -> ChildProc {
        let exe = std::env::current_exe().unwrap();
        let dir = child_dir();
        let mut cmd = Command::new(&exe);
        cmd.args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
            .env("UPAGER_CHILD", scenario)
            .env(PARENT_DIR_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in io::BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        ChildProc {
            child,
            lines,
            seen: Vec::new(),
            _dir: dir,
        }
    }

    /// Waits for a stdout line containing `prefix` (the test harness may
    /// print "test child_main ... " before it on the same line); returns it.
    /// Panics after `timeout` or if the child exits first.
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.contains(prefix) {
                        return l;
                    }
                }
                Err(e) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!(
                        "no line {prefix:?} from the child ({e:?}); saw {:?}",
                        self.seen
                    );
                }
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("timed out waiting for {prefix:?}; saw {:?}", self.seen);
            }
        }
    }

    /// SIGKILLs the child and reaps it.
    pub fn kill(&mut self) -> std::process::ExitStatus {
        let _ = self.child.kill();
        self.child.wait().unwrap()
    }

    /// Waits (bounded) for the child to exit; kills it and panics on timeout.
    pub fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                // Collect the rest of the output.
                while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
                    self.seen.push(l);
                }
                return s;
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("child did not exit within {timeout:?}; saw {:?}", self.seen);
            }
            // The poll interval of this bounded wait for the child's exit.
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A private, size-limited tmpfs mounted for one test (root only), so a
/// test can fill a file system, make it read-only, or measure exactly the
/// space its files use. Unmounted (lazily) on drop.
pub struct SmallTmpfs {
    pub dir: tempfile::TempDir,
}

impl SmallTmpfs {
    /// Mounts a tmpfs of `size` bytes; None (with a message; a failure
    /// under `CI=true`: see [`skip_or_fail`]) if mounting is not allowed
    /// here.
    #[track_caller]
    pub fn mount(size: u64) -> Option<SmallTmpfs> {
        let dir = tempfile::Builder::new()
            .prefix("upager-tmpfs")
            .tempdir_in("/tmp")
            .unwrap();
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status();
        match st {
            Ok(s) if s.success() => Some(SmallTmpfs { dir }),
            Ok(s) => {
                skip_or_fail(&format!(
                    "no private tmpfs for this test's checks: `mount -t tmpfs` failed \
                     ({s}; mounting needs root)"
                ));
                None
            }
            Err(e) => {
                skip_or_fail(&format!(
                    "no private tmpfs for this test's checks: cannot run `mount`: {e}"
                ));
                None
            }
        }
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    /// `mount -o remount,<opts>` (e.g. "size=16m", "ro", "rw").
    pub fn remount(&self, opts: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,{opts}")])
            .arg(self.dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "remount {opts} failed");
    }
    /// Bytes in use (blocks of the file system, from df's point of view).
    pub fn used_bytes(&self) -> u64 {
        let out = Command::new("df")
            .args(["-B1", "--output=used"])
            .arg(self.dir.path())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .unwrap()
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// `(fd, link target)` of every open descriptor of process `pid` ("self" for
/// this one).
pub fn open_fds(pid: &str) -> Vec<(u32, String)> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    rd.filter_map(|e| {
        let e = e.ok()?;
        let fd = e.file_name().to_str()?.parse().ok()?;
        let target = std::fs::read_link(e.path()).ok()?;
        Some((fd, target.to_string_lossy().into_owned()))
    })
    .collect()
}

/// Puts a fault of region `r` (at its start) in flight, blocked in
/// `store`'s closed read gate, and returns the thread that waits for it.
/// Handler mode: a system call (`pwrite` from region memory) faults inside
/// the kernel; in-thread mode (where a system call gets EFAULT instead): a
/// prefetch, whose fill holds the region in flight the same way.
pub fn blocked_syscall_fault(
    store: &TestStore,
    dir: &Path,
    r: &upager::Region,
) -> std::thread::JoinHandle<io::Result<u64>> {
    let out = std::fs::File::create(dir.join("blocked-syscall-out")).unwrap();
    let before = store.reads_blocked.load(Ordering::SeqCst);
    let addr = r.as_ptr() as u64;
    let syscall = if in_thread() {
        r.prefetch(0, r.folio_size()).unwrap();
        std::thread::spawn(|| Ok(4096))
    } else {
        std::thread::spawn(move || upager_sys::io::pwrite_from(&out, addr, 4096, 0))
    };
    wait_until("the fault to reach the store's closed gate", 10, || {
        store.reads_blocked.load(Ordering::SeqCst) != before
    });
    syscall
}

/// The tests run in the fault mode `UPAGER_FAULT_MODE` names (the
/// builder's default): true for in-thread.
pub fn in_thread() -> bool {
    matches!(
        upager::FaultMode::from_env(),
        Ok(Some(upager::FaultMode::InThread))
    )
}

/// A system call on region memory `[off, off+len)` of `r`: in in-thread
/// mode (where a system call on a non-resident page fails with EFAULT) the
/// range is pinned for the call (`Region::pin`, `unpin` after; a range of
/// more than half the budget is faulted in instead, and the call retried if
/// eviction raced it); an error of `pin` (a folio that cannot be filled, a
/// refused write) is EFAULT, as handler mode's call reports it. Handler
/// mode makes the call as it is.
pub fn syscall_on<T>(
    r: &upager::Region,
    off: u64,
    len: u64,
    write: bool,
    mut call: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    if !in_thread() {
        return call();
    }
    match r.pin(off, len, write) {
        Ok(()) => {
            let res = call();
            r.unpin(off, len).unwrap();
            res
        }
        // More than half the budget cannot be pinned: fault it in and
        // retry the call if eviction raced it (what fault_in's doc says).
        Err(upager::AdviseError::PinLimit { .. }) => {
            for _ in 0..8 {
                if r.fault_in(off, len, write).is_err() {
                    break;
                }
                match call() {
                    Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {}
                    res => return res,
                }
            }
            Err(io::Error::from_raw_os_error(libc::EFAULT))
        }
        Err(_) => Err(io::Error::from_raw_os_error(libc::EFAULT)),
    }
}

/// THP usable here, else skip (fail under CI).
pub fn thp_available() -> bool {
    for f in ["uffd_move", "pagemap_scan"] {
        if masked(f) {
            eprintln!(
                "skipped: {f} is masked (UPAGER_MASK_FEATURES): no huge pages move into views"
            );
            return false;
        }
    }
    let enabled =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if enabled.is_empty() || enabled.contains("[never]") {
        skip_or_fail(
            "transparent huge pages are off (/sys/kernel/mm/transparent_hugepage/enabled)",
        );
        return false;
    }
    true
}

/// Runs a command a test needs for its setup (mounting, a loop device):
/// its standard output if it succeeded; else the test cannot run here, said
/// by [`skip_or_fail`] with `what` and the command's error, and `None`.
pub fn setup_command(cmd: &mut std::process::Command, what: &str) -> Option<String> {
    match cmd.stderr(std::process::Stdio::piped()).output() {
        Ok(o) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => {
            skip_or_fail(&format!(
                "{what} failed ({}: {})",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ));
            None
        }
        Err(e) => {
            skip_or_fail(&format!("{what}: cannot run it: {e}"));
            None
        }
    }
}

/// Whether a pager here unmaps eviction batches with one `process_madvise`
/// each (false where a seccomp filter or the kernel refuses it, or it is
/// masked: one `madvise` per range then).
pub fn unmap_is_batched() -> bool {
    upager::Pager::builder()
        .budget(1 << 20)
        .build()
        .is_ok_and(|p| p.info().batched_unmap)
}

/// Whether this process runs under a seccomp filter (`Seccomp: 2` in
/// /proc/self/status): scripts/test.sh runs the suite once so, refusing
/// process_madvise and io_uring as a container's profile does.
pub fn under_seccomp_filter() -> bool {
    upager_sys::seccomp::status().is_ok_and(|(mode, _)| mode == 2)
}

/// Log records (warnings and errors) of this test process, for tests of
/// what upager says (a truncation, a fallback): [`capture_log`] installs it.
pub struct Capture(pub Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            self.0.lock().unwrap().push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

/// The records [`capture_log`] keeps.
pub static LOG: Capture = Capture(Mutex::new(Vec::new()));

/// Makes [`LOG`] the process's logger (warnings and errors).
pub fn capture_log() {
    let _ = log::set_logger(&LOG);
    log::set_max_level(log::LevelFilter::Warn);
}

/// Whether `feature` is masked for this test run (`UPAGER_MASK_FEATURES`,
/// as on a kernel without it): a test of what the feature gives skips, saying so (a
/// deliberate mask, not a missing capability: no failure under CI).
pub fn masked(feature: &str) -> bool {
    std::env::var("UPAGER_MASK_FEATURES").is_ok_and(|v| {
        v.split(',')
            .any(|f| f.trim() == feature || f.trim() == "all")
    })
}

/// Whether the 2 MiB at `addr` are one PMD-mapped huge page now
/// (PAGEMAP_SCAN; never where moves or the scan are masked: no huge page
/// enters a view then).
pub fn huge_at(addr: u64) -> bool {
    if masked("pagemap_scan") || masked("uffd_move") {
        return false;
    }
    let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
    upager_sys::pagemap::is_huge(&pagemap, addr, 2 << 20).unwrap()
}
