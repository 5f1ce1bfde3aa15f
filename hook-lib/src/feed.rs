//! The node's utilisation feed (`docs/shim-contract.md`, "The utilisation feed"): the
//! claim's SM utilisation per GPU as the node monitor measured it with host PIDs.
//! Read-only to the container, replaced atomically by the monitor; version 1.

use std::path::Path;

use crate::claims::parse_uuid_key;

/// A well-formed feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feed {
    pub sampled_unix_ms: u64,
    pub window_ms: u64,
    /// (GPU UUID, SM utilisation in permille).
    pub sm: Vec<([u8; 16], u32)>,
}

impl Feed {
    /// Parses the feed; `Err` names the line that is wrong.
    pub fn parse(text: &str) -> Result<Feed, String> {
        let mut version = None;
        let mut sampled = None;
        let mut window = None;
        let mut sm = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                return Err(format!("line {}: expected key=value", n + 1));
            };
            let (k, v) = (k.trim(), v.trim());
            let num = || {
                v.parse::<u64>()
                    .map_err(|_| format!("line {}: {k}={v:?} is not a number", n + 1))
            };
            match k {
                "version" => version = Some(num()?),
                "sampled_unix_ms" => sampled = Some(num()?),
                "window_ms" => window = Some(num()?),
                _ => {
                    if let Some((uuid, field)) = parse_uuid_key(k)
                        && field == "sm_permille"
                    {
                        let p = num()?;
                        if p > 1000 {
                            return Err(format!("line {}: {k}={p} is above 1000", n + 1));
                        }
                        sm.push((uuid, p as u32));
                    }
                }
            }
        }
        if version != Some(1) {
            return Err("version is not 1".into());
        }
        Ok(Feed {
            sampled_unix_ms: sampled.ok_or("no sampled_unix_ms")?,
            window_ms: window.ok_or("no window_ms")?,
            sm,
        })
    }

    /// Fresh at `now_ms`: `now - sampled <= min(3 * window, 5000)`.
    pub fn fresh(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.sampled_unix_ms) <= (3 * self.window_ms).min(5000)
            && self.sampled_unix_ms <= now_ms + 1000
    }

    pub fn sm_permille(&self, uuid: &[u8; 16]) -> Option<u32> {
        self.sm.iter().find(|x| x.0 == *uuid).map(|x| x.1)
    }
}

/// The feed at `path` if present, well-formed and fresh at `now_ms`. A malformed one
/// is ignored (logged with `FGPU_LOG=debug`): the feed only refines the limiter.
pub fn read(path: &Path, now_ms: u64) -> Option<Feed> {
    let text = std::fs::read_to_string(path).ok()?;
    match Feed::parse(&text) {
        Ok(f) if f.fresh(now_ms) => Some(f),
        Ok(_) => None,
        Err(e) => {
            crate::debug!("feed {}: {e}; ignored", path.display());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: &str = "GPU-fa4ec0da-0000-0000-8000-000000000003";

    #[test]
    fn parses_and_checks_freshness() {
        let f = Feed::parse(&format!(
            "version=1\nsampled_unix_ms=10000\nwindow_ms=500\ngpu.{U}.sm_permille=300\ngpu.{U}.pids=1,2\n"
        ))
        .unwrap();
        let mut u = [0u8; 16];
        u[..4].copy_from_slice(&[0xfa, 0x4e, 0xc0, 0xda]);
        u[8] = 0x80;
        u[15] = 3;
        assert_eq!(f.sm_permille(&u), Some(300));
        assert!(f.fresh(11_500));
        assert!(!f.fresh(11_501));
        // A stamp from the future is not fresh either.
        assert!(!f.fresh(8_000));
        assert!(Feed::parse("version=2\nsampled_unix_ms=1\nwindow_ms=1\n").is_err());
        assert!(
            Feed::parse(&format!(
                "version=1\nsampled_unix_ms=1\nwindow_ms=1\ngpu.{U}.sm_permille=1001\n"
            ))
            .is_err()
        );
        assert!(Feed::parse("version=1\nwindow_ms=1\n").is_err());
    }
}
