//! Progress of bringing the weights in: a bar on a terminal, one plain line otherwise
//! (`loading weights (copy): 3.34 GiB ... done in 8.1 s`), nothing when quiet.
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    /// Plain mode: the line was started and `finish` (or a failure) completes it.
    plain: AtomicBool,
    t0: Instant,
    total: u64,
}

const GIB: f64 = (1u64 << 30) as f64;

impl Progress {
    /// `reads`: whether the load reads the bytes now (a lazy mapping prints one line and no timing).
    pub(crate) fn start(what: &str, total: u64, reads: bool, quiet: bool) -> Self {
        let mut p = Self { bar: None, plain: AtomicBool::new(false), t0: Instant::now(), total };
        if quiet {
            return p;
        }
        if !reads {
            eprintln!("{what}: {:.2} GiB", total as f64 / GIB);
        } else if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total);
            let style = ProgressStyle::with_template("{msg} {wide_bar} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_message(what.to_string());
            p.bar = Some(bar);
        } else {
            eprint!("{what}: {:.2} GiB ...", total as f64 / GIB);
            p.plain.store(true, Ordering::Relaxed);
        }
        p
    }

    /// `done` bytes so far (calls may come from several threads, slightly out of order).
    pub(crate) fn set(&self, done: u64) {
        if let Some(b) = &self.bar {
            if done > b.position() {
                b.set_position(done);
            }
        }
    }

    pub(crate) fn finish(&self) {
        let dt = self.t0.elapsed().as_secs_f64();
        let rate = self.total as f64 / GIB / dt.max(1e-9);
        if let Some(b) = &self.bar {
            b.finish_and_clear();
            eprintln!("{} {:.2} GiB in {dt:.1} s ({rate:.2} GiB/s)", b.message(), self.total as f64 / GIB);
        } else if self.plain.swap(false, Ordering::Relaxed) {
            eprintln!(" done in {dt:.1} s ({rate:.2} GiB/s)");
        }
    }
}

impl Drop for Progress {
    /// A load that failed half-way ends its line, so the error starts on its own.
    fn drop(&mut self) {
        if self.plain.load(Ordering::Relaxed) {
            eprintln!(" failed");
        }
        if let Some(b) = &self.bar {
            if !b.is_finished() {
                b.abandon();
            }
        }
    }
}
