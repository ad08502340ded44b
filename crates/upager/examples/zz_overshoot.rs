use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use upager::{FaultMode, MapOptions, Pager, Residency};
fn main() {
    let mode = if std::env::args().nth(1).as_deref() == Some("h") {
        FaultMode::Handlers
    } else {
        FaultMode::InThread
    };
    let budget = 24u64 << 20;
    let path = "/dev/shm/zz_over";
    std::fs::write(path, vec![1u8; (72 << 20) as usize]).unwrap();
    let pager = Arc::new(
        Pager::builder()
            .budget(budget)
            .fault_mode(mode)
            .build()
            .unwrap(),
    );
    let r = Arc::new(
        pager
            .map_file(path, &MapOptions::new().writable(true).folio(64 << 10))
            .unwrap(),
    );
    let anon = Arc::new(
        pager
            .map_anonymous(48 << 20, &MapOptions::new().folio(16 << 10))
            .unwrap(),
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut th = Vec::new();
    for t in 0..4u64 {
        let (r, anon, stop) = (Arc::clone(&r), Arc::clone(&anon), Arc::clone(&stop));
        th.push(std::thread::spawn(move || {
            let mut x = t * 7919 + 1;
            let w = r.words();
            let a = anon.words();
            while !stop.load(Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x as usize) % w.len();
                if x % 3 == 0 {
                    w[i].store(x, Relaxed);
                } else {
                    let _ = w[i].load(Relaxed);
                }
                let j = (x as usize >> 3) % a.len();
                if x % 5 == 0 {
                    a[j].store(x, Relaxed);
                } else {
                    let _ = a[j].load(Relaxed);
                }
                if x % 50000 == 0 {
                    let _ = r.flush();
                }
                if x % 3001 == 0 {
                    let off = (x % 70) << 20;
                    let _ = r.prefetch(off, 1 << 20);
                }
                if x % 7001 == 0 {
                    let off = (x % 70) << 20;
                    let _ = r.pageout(off, 1 << 20);
                }
                if x % 9001 == 0 {
                    let off = (x % 40) << 20;
                    let _ = anon.prefetch(off, 1 << 20);
                }
            }
        }));
    }
    let churn: Arc<std::sync::Mutex<Vec<(u64, u64)>>> = Arc::default();
    {
        let (pager2, churn, stop) = (Arc::clone(&pager), Arc::clone(&churn), Arc::clone(&stop));
        std::fs::write("/dev/shm/zz_churn", vec![2u8; 24 << 20]).unwrap();
        th.push(std::thread::spawn(move || {
            let mut k = 0u64;
            while !stop.load(Relaxed) {
                k += 1;
                let folio = 4096u64 << (k % 6);
                let c = pager2
                    .map_file(
                        "/dev/shm/zz_churn",
                        &MapOptions::new().writable(true).folio(folio),
                    )
                    .unwrap();
                churn
                    .lock()
                    .unwrap()
                    .push((c.as_ptr() as u64, c.len() as u64));
                let w = c.words();
                for i in (0..w.len()).step_by(97) {
                    if i % 3 == 0 {
                        w[i].store(k, Relaxed);
                    } else {
                        let _ = w[i].load(Relaxed);
                    }
                }
                if k % 2 == 0 {
                    let _ = c.flush();
                }
                churn.lock().unwrap().clear();
                c.unmap().map_err(|(e, _)| e).unwrap();
            }
        }));
    }
    let t0 = std::time::Instant::now();
    let mut max = 0u64;
    while t0.elapsed().as_secs() < 90 {
        let mut mapped = 0u64;
        let mut leak = std::collections::BTreeMap::new();
        for reg in [&r, &anon] {
            let base = reg.as_ptr() as u64;
            let v = upager_sys::mem::mincore(base, reg.len() as u64).unwrap();
            let n = v.iter().filter(|b| **b & 1 == 1).count() as u64;
            mapped += n * 4096;
            if n * 4096 > 0 {
                let res = reg.residency(0, reg.len() as u64).unwrap();
                for (range, st) in res {
                    let p0 = (range.start / 4096) as usize;
                    let p1 = (range.end.div_ceil(4096)) as usize;
                    let present = v[p0..p1.min(v.len())]
                        .iter()
                        .filter(|b| **b & 1 == 1)
                        .count();
                    if present > 0 && matches!(st, Residency::NeverTouched | Residency::Evicted) {
                        *leak.entry(format!("{st:?}")).or_insert(0usize) += present;
                    }
                }
            }
        }
        {
            let g = churn.lock().unwrap();
            for &(a, l) in g.iter() {
                let v = upager_sys::mem::mincore(a, l).unwrap();
                mapped += v.iter().filter(|b| **b & 1 == 1).count() as u64 * 4096;
            }
        }
        if mapped > max {
            max = mapped;
        }
        if mapped > budget + (4 << 20) {
            println!(
                "t={:.1}s mapped {:.1} MiB engine resident {:.1} MiB leaked pages by state {:?}",
                t0.elapsed().as_secs_f64(),
                mapped as f64 / 1048576.0,
                pager.stats().resident_bytes as f64 / 1048576.0,
                leak
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    stop.store(true, Relaxed);
    for t in th {
        t.join().unwrap();
    }
    println!(
        "max mapped {:.1} MiB, stats {:?}",
        max as f64 / 1048576.0,
        pager.stats().resident_peak_bytes
    );
}
