//! Durations on the command line of `upager-stress` and `upager-soak`.

use std::time::Duration;

/// Parses `30s`, `1.5m`, `4h`, `250ms` (no unit: seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(
        s.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len()),
    );
    let n: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("bad duration unit in {s:?} (use ms, s, m or h)")),
    };
    Ok(Duration::from_secs_f64(secs))
}
