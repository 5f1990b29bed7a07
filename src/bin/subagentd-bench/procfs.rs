//! CPU time and memory of a process, read from `/proc` (Linux only).
//!
//! Why `/proc` and not rusage: the servers are child processes that keep
//! running between measurements, so the bench samples their cumulative
//! counters before and after each timed run instead of waiting for them to
//! exit.

use std::{io, sync::OnceLock};

/// Which process to read.
#[derive(Debug, Clone, Copy)]
pub enum Pid {
    /// This process (the load client).
    This,
    /// Another process.
    Other(u32),
}

impl Pid {
    fn path(self, file: &str) -> String {
        match self {
            Pid::This => format!("/proc/self/{file}"),
            Pid::Other(pid) => format!("/proc/{pid}/{file}"),
        }
    }
}

/// User + system CPU time of `pid` so far, in clock ticks (all threads).
pub fn cpu_ticks(pid: Pid) -> io::Result<u64> {
    let stat = std::fs::read_to_string(pid.path("stat"))?;
    parse_cpu_ticks(&stat)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unexpected /proc/PID/stat"))
}

/// Ticks per second of [`cpu_ticks`]: `getconf CLK_TCK`, 100 if that fails
/// (it is 100 on every Linux this runs on; asking avoids a libc dependency).
pub fn clock_ticks_per_second() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse().ok())
            .filter(|&t: &u64| t > 0)
            .unwrap_or(100)
    })
}

/// Converts [`cpu_ticks`] to seconds.
pub fn ticks_to_seconds(ticks: u64) -> f64 {
    ticks as f64 / clock_ticks_per_second() as f64
}

/// Resident memory of a process.
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    /// `VmRSS`: resident now, bytes.
    pub rss_bytes: u64,
    /// `VmHWM`: the peak resident size so far, bytes.
    pub peak_rss_bytes: u64,
}

/// Reads `VmRSS` and `VmHWM` of `pid`.
pub fn memory(pid: Pid) -> io::Result<Memory> {
    let status = std::fs::read_to_string(pid.path("status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no {name}")))
    };
    Ok(Memory {
        rss_bytes: field("VmRSS:")?,
        peak_rss_bytes: field("VmHWM:")?,
    })
}

/// utime (field 14) + stime (field 15). The command name (field 2) is in
/// parentheses and may hold spaces or parentheses itself, so fields are
/// counted from the last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11); // fields 3..=13
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The CPU model and core count, for the report header.
pub fn machine_description() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {model}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_count_fields_after_the_command_name() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 3 0 1 2 3";
        assert_eq!(parse_cpu_ticks(stat), Some(12));
    }

    #[test]
    fn this_process_has_memory_and_cpu() {
        let m = memory(Pid::This).unwrap();
        assert!(m.rss_bytes > 0 && m.peak_rss_bytes >= m.rss_bytes);
        cpu_ticks(Pid::This).unwrap();
    }
}
