//! Injected device faults, as fake NVML reports them.
//!
//! `FAKE_CUDA_FAULTS` names a JSON file in the fake backend's format
//! (`{"gpus": {"GPU-…": ["xid 79", "ecc", "lost", "retired-pages", "temperature 97"]}}`,
//! written by `fgpu-kubelet-plugin fake-fault`), re-read at every query, so the same file
//! drives both the fake backend and this library. What each word does here, as on a real
//! node:
//!
//! * `xid <n>`: one critical-XID event with data `n` to every event set registered for
//!   XIDs on that GPU *when the word appears*; a fault already listed when the set was
//!   registered is never delivered (NVML does not replay the past). XID 79 (fallen off the
//!   bus) also makes the GPU lost while it is listed.
//! * `ecc`: one double-bit ECC event the same way, and the volatile and aggregate
//!   uncorrected ECC counters read 1 while listed.
//! * `lost`: `nvmlDeviceGetMemoryInfo[_v2]` and the probes answer `NVML_ERROR_GPU_IS_LOST`.
//! * `retired-pages`: `nvmlDeviceGetRetiredPagesPendingStatus` answers enabled.
//! * `temperature <C>`: the GPU sensor reads `C` °C (default [`IDLE_CELSIUS`]; the
//!   shutdown threshold is [`SHUTDOWN_CELSIUS`]).
//!
//! A file that cannot be parsed makes every health query answer `NVML_ERROR_UNKNOWN`: a
//! broken injection shows as a failing probe, never as a healthy GPU.

use std::collections::{BTreeSet, HashMap};

/// The GPU sensor's reading without an injected temperature, °C.
pub const IDLE_CELSIUS: u32 = 45;
/// The shutdown threshold fake NVML reports, °C.
pub const SHUTDOWN_CELSIUS: u32 = 95;
/// The slowdown threshold fake NVML reports, °C.
pub const SLOWDOWN_CELSIUS: u32 = 92;

/// `nvmlEventTypeSingleBitEccError`.
pub const EVENT_SINGLE_BIT_ECC: u64 = 0x1;
/// `nvmlEventTypeDoubleBitEccError`.
pub const EVENT_DOUBLE_BIT_ECC: u64 = 0x2;
/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID: u64 = 0x8;
/// The event types every fake GPU supports.
pub const SUPPORTED_EVENTS: u64 = EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID;

/// The XID of a GPU that has fallen off the bus.
const XID_FALLEN_OFF_THE_BUS: u32 = 79;

/// What is wrong with one GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuFaults {
    pub xids: BTreeSet<u32>,
    pub ecc: bool,
    pub lost: bool,
    pub retired_pages: bool,
    pub celsius: Option<u32>,
}

impl GpuFaults {
    /// Lost: listed as lost, or fallen off the bus.
    pub fn is_lost(&self) -> bool {
        self.lost || self.xids.contains(&XID_FALLEN_OFF_THE_BUS)
    }

    /// The one-shot events this state raises, as (event type, data).
    fn events(&self) -> BTreeSet<(u64, u64)> {
        let mut out: BTreeSet<(u64, u64)> = self
            .xids
            .iter()
            .map(|&n| (EVENT_XID, u64::from(n)))
            .collect();
        if self.ecc {
            out.insert((EVENT_DOUBLE_BIT_ECC, 0));
        }
        out
    }
}

/// The injected faults by GPU UUID (`gpu-…`: compared in lower case).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Injected {
    pub gpus: HashMap<String, GpuFaults>,
}

impl Injected {
    /// The faults of `uuid`, in any case (none when not listed).
    pub fn of(&self, uuid: &str) -> GpuFaults {
        self.gpus
            .get(&uuid.to_ascii_lowercase())
            .cloned()
            .unwrap_or_default()
    }
}

/// Parses the fault file's text; an unknown word or a malformed document is an error.
pub fn parse(text: &str) -> Result<Injected, String> {
    let doc: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut out = Injected::default();
    let Some(gpus) = doc.get("gpus") else {
        return Ok(out);
    };
    let gpus = gpus.as_object().ok_or("gpus: not an object")?;
    for (uuid, list) in gpus {
        let list = list
            .as_array()
            .ok_or_else(|| format!("gpus.{uuid}: not a list"))?;
        let mut f = GpuFaults::default();
        for word in list {
            let word = word
                .as_str()
                .ok_or_else(|| format!("gpus.{uuid}: not a string: {word}"))?;
            let lower = word.trim().to_ascii_lowercase();
            let mut parts = lower.split_whitespace();
            let number = |p: Option<&str>| -> Result<u32, String> {
                p.and_then(|n| n.trim_end_matches(':').parse().ok())
                    .ok_or_else(|| format!("gpus.{uuid}: {word:?} needs a number"))
            };
            match parts.next() {
                Some("xid") => {
                    f.xids.insert(number(parts.next())?);
                }
                Some("ecc") => f.ecc = true,
                Some("lost") => f.lost = true,
                Some("retired-pages") => f.retired_pages = true,
                Some("temperature") => f.celsius = Some(number(parts.next())?),
                _ => return Err(format!("gpus.{uuid}: unknown fault {word:?}")),
            }
        }
        out.gpus.insert(uuid.to_ascii_lowercase(), f);
    }
    Ok(out)
}

/// The injected faults now: none without `FAKE_CUDA_FAULTS` or while its file is absent.
pub fn current() -> Result<Injected, String> {
    let Some(path) = std::env::var_os("FAKE_CUDA_FAULTS") else {
        return Ok(Injected::default());
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Injected::default()),
        Err(e) => Err(e.to_string()),
    }
}

/// One event as `nvmlEventSetWait` hands it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub device: usize,
    pub event_type: u64,
    pub data: u64,
}

/// An event set: the GPUs registered on it with their event masks, and the events each
/// GPU's current faults raise that it has already seen (delivered, or present at
/// registration).
#[derive(Debug, Default)]
pub struct EventSet {
    registered: HashMap<usize, u64>,
    seen: HashMap<usize, BTreeSet<(u64, u64)>>,
    pending: Vec<Event>,
}

impl EventSet {
    /// Registers `mask` on `device`, whose faults are `now` (not delivered later).
    pub fn register(&mut self, device: usize, mask: u64, now: &GpuFaults) {
        *self.registered.entry(device).or_default() |= mask;
        self.seen.entry(device).or_default().extend(now.events());
    }

    /// The next event, given each registered GPU's faults now (`faults_of(device)`); new
    /// faults queue their events, faults no longer listed are forgotten (so injecting them
    /// again raises them again).
    pub fn next(&mut self, faults_of: impl Fn(usize) -> GpuFaults) -> Option<Event> {
        let mut devices: Vec<usize> = self.registered.keys().copied().collect();
        devices.sort_unstable();
        for device in devices {
            let mask = self.registered[&device];
            let now = faults_of(device).events();
            let seen = self.seen.entry(device).or_default();
            seen.retain(|e| now.contains(e));
            for e in now {
                if seen.insert(e) && mask & e.0 != 0 {
                    self.pending.push(Event {
                        device,
                        event_type: e.0,
                        data: e.1,
                    });
                }
            }
        }
        (!self.pending.is_empty()).then(|| self.pending.remove(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_fake_backend_words() {
        let i = parse(
            r#"{"gpus": {"GPU-AB": ["xid 79", "XID 13:", "ecc", "retired-pages", "temperature 97"], "GPU-cd": ["lost"]}}"#,
        )
        .unwrap();
        let ab = i.of("GPU-ab");
        assert_eq!(ab.xids, BTreeSet::from([13, 79]));
        assert!(ab.ecc && ab.retired_pages && ab.is_lost());
        assert_eq!(ab.celsius, Some(97));
        assert!(i.of("GPU-CD").lost);
        assert_eq!(i.of("gpu-ef"), GpuFaults::default());
        assert_eq!(parse("{}").unwrap(), Injected::default());
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for bad in [
            "not json",
            r#"{"gpus": []}"#,
            r#"{"gpus": {"GPU-a": "xid 79"}}"#,
            r#"{"gpus": {"GPU-a": ["xid"]}}"#,
            r#"{"gpus": {"GPU-a": ["melted"]}}"#,
            r#"{"gpus": {"GPU-a": [7]}}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    fn xid(n: u32) -> GpuFaults {
        GpuFaults {
            xids: BTreeSet::from([n]),
            ..Default::default()
        }
    }

    #[test]
    fn events_fire_once_per_appearance_and_not_for_the_past() {
        let mut set = EventSet::default();
        // XID 31 was there before registration: never delivered.
        set.register(0, EVENT_XID, &xid(31));
        let mut now = xid(31);
        assert_eq!(set.next(|_| now.clone()), None);
        now.xids.insert(79);
        now.ecc = true;
        let ev = set.next(|_| now.clone());
        assert_eq!(
            ev,
            Some(Event {
                device: 0,
                event_type: EVENT_XID,
                data: 79
            })
        );
        // Once only; the ECC event is not registered on this set.
        assert_eq!(set.next(|_| now.clone()), None);
        // Cleared, then injected again: raised again.
        assert_eq!(set.next(|_| GpuFaults::default()), None);
        assert_eq!(set.next(|_| xid(79)).map(|e| e.data), Some(79));
        // A GPU not registered raises nothing.
        let mut other = EventSet::default();
        other.register(1, EVENT_DOUBLE_BIT_ECC, &GpuFaults::default());
        let ecc = GpuFaults {
            ecc: true,
            ..Default::default()
        };
        assert_eq!(
            other.next(|d| if d == 1 { ecc.clone() } else { xid(79) }),
            Some(Event {
                device: 1,
                event_type: EVENT_DOUBLE_BIT_ECC,
                data: 0
            })
        );
    }
}
