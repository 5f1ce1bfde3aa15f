//! Each GPU's mode (`shared`, `mig` or `whole`): what the admin asks for, and when the
//! plugin takes a change.
//!
//! The mode the admin wants for a GPU is, first found wins:
//!
//! 1. the node label `fgpu.dev/gpu-mode-<index>` (one GPU);
//! 2. the node label `fgpu.dev/gpu-mode` (every GPU of the node);
//! 3. the flag `--gpu-mode` entry for the GPU's index or UUID (`0=mig,GPU-…=whole`);
//! 4. the flag's entry without a key (`--gpu-mode mig`: every GPU);
//! 5. the backend's own say (the fake profile's `mode:`; NVML has none);
//! 6. `shared`.
//!
//! A label or flag value that is not a mode is reported (naming the label or the entry)
//! and skipped. [`ModeKeeper`] takes a wanted mode only while the GPU holds no prepared
//! claim; otherwise it keeps the mode in force and reports a [`Refusal`] once. The modes in
//! force are kept in a small file in the plugin's state directory, so that a restarted
//! plugin does not take a change it would have refused.
//!
//! The same machinery ([`GpuFlag`], [`wanted`], [`Keeper`]) serves every per-GPU
//! [`Setting`] the admin gives this way: the mode here, the oversubscription ratio of the
//! research tier in [`crate::tier`].
//!
//! `--mig-fixed-layout` ([`FixedLayouts`]) lists the MIG profiles to publish on a MIG-mode
//! GPU where the API server has no partitionable devices (see [`crate::mig_slice`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::str::FromStr;

use fgpu_api::names::label;
use fgpu_driver::device::{Gpu, GpuMode, TierRatio};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::checkpoint::{Durability, write_atomic};

/// A per-GPU setting the admin gives by node label and flag: parsed from text (the error
/// says what is valid), kept in the plugin's state directory.
pub trait Setting:
    Copy + PartialEq + std::fmt::Display + FromStr<Err = String> + Serialize + DeserializeOwned
{
    /// What messages call it: `mode`.
    const NOUN: &'static str;
    /// Its flag: `--gpu-mode`.
    const FLAG: &'static str;
}

impl Setting for GpuMode {
    const NOUN: &'static str = "mode";
    const FLAG: &'static str = "--gpu-mode";
}

/// Which GPU a flag entry names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GpuRef {
    /// By NVML index.
    Index(u32),
    /// By UUID (`GPU-…`).
    Uuid(String),
}

impl GpuRef {
    fn parse(text: &str) -> Result<Self, String> {
        if let Ok(i) = text.parse() {
            return Ok(Self::Index(i));
        }
        if text.starts_with("GPU-") {
            return Ok(Self::Uuid(text.to_owned()));
        }
        Err(format!(
            "{text:?} is neither a GPU index nor a GPU UUID (GPU-…)"
        ))
    }

    fn matches(&self, gpu: &Gpu) -> bool {
        match self {
            Self::Index(i) => gpu.index == *i,
            Self::Uuid(u) => gpu.uuid == *u,
        }
    }
}

impl std::fmt::Display for GpuRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Index(i) => write!(f, "{i}"),
            Self::Uuid(u) => f.write_str(u),
        }
    }
}

/// Splits `[<index|UUID>=]<value>` entries.
fn entries(text: &str) -> impl Iterator<Item = (Option<&str>, &str)> {
    text.split(';')
        .flat_map(|part| part.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once('=') {
            Some((k, v)) => (Some(k.trim()), v.trim()),
            None => (None, e),
        })
}

/// A setting's flag: a value for every GPU and/or per GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuFlag<V> {
    /// The entry without a key.
    pub all: Option<V>,
    /// Entries by index or UUID.
    pub by_gpu: BTreeMap<GpuRef, V>,
}

/// The `--gpu-mode` flag.
pub type ModeFlag = GpuFlag<GpuMode>;

impl<V> Default for GpuFlag<V> {
    fn default() -> Self {
        Self {
            all: None,
            by_gpu: BTreeMap::new(),
        }
    }
}

impl<V: Setting> GpuFlag<V> {
    /// The entry for `gpu`: its own, else the one for every GPU.
    pub fn for_gpu(&self, gpu: &Gpu) -> Option<V> {
        self.by_gpu
            .iter()
            .find(|(r, _)| r.matches(gpu))
            .map(|(_, v)| *v)
            .or(self.all)
    }
}

impl<V: Setting> FromStr for GpuFlag<V> {
    type Err = String;

    /// Parses `mig`, `0=mig,1=whole`, `shared,GPU-…=mig` (empty: no entry). The error
    /// names the flag and the entry.
    fn from_str(text: &str) -> Result<Self, String> {
        let flag_name = V::FLAG;
        let mut flag = Self::default();
        for (key, value) in entries(text) {
            let v: V = value
                .parse()
                .map_err(|e| format!("{flag_name} entry {value:?}: {e}"))?;
            match (key, flag.all) {
                (None, Some(all)) => {
                    return Err(format!(
                        "{flag_name}: two entries for every GPU ({all} and {v})"
                    ));
                }
                (None, None) => flag.all = Some(v),
                (Some(k), _) => {
                    let r = GpuRef::parse(k)
                        .map_err(|e| format!("{flag_name} entry {k}={value}: {e}"))?;
                    if flag.by_gpu.insert(r, v).is_some() {
                        return Err(format!("{flag_name}: GPU {k} is named twice"));
                    }
                }
            }
        }
        Ok(flag)
    }
}

/// The `--mig-fixed-layout` flag: the MIG profiles to publish per MIG-mode GPU where the
/// API server has no partitionable devices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FixedLayouts {
    /// The profiles of every MIG-mode GPU without an entry of its own.
    pub all: Vec<String>,
    /// Profiles by GPU.
    pub by_gpu: BTreeMap<GpuRef, Vec<String>>,
}

impl FixedLayouts {
    /// The profiles listed for `gpu` (empty: none).
    pub fn for_gpu(&self, gpu: &Gpu) -> &[String] {
        self.by_gpu
            .iter()
            .find(|(r, _)| r.matches(gpu))
            .map_or(self.all.as_slice(), |(_, p)| p.as_slice())
    }
}

impl FromStr for FixedLayouts {
    type Err = String;

    /// Parses `;`-separated groups `[<index|UUID>=]<profile>[*<n>],…`, e.g.
    /// `1g.10gb*7` or `0=3g.40gb,3g.40gb;1=7g.80gb`. A profile name is checked against
    /// the GPU's table when the slice is built, not here.
    fn from_str(text: &str) -> Result<Self, String> {
        let mut layouts = Self::default();
        for group in text.split(';').map(str::trim).filter(|g| !g.is_empty()) {
            let (key, list) = match group.split_once('=') {
                Some((k, v)) => (Some(k.trim()), v),
                None => (None, group),
            };
            let mut profiles = Vec::new();
            for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                let (name, count) = match item.split_once('*') {
                    Some((n, c)) => {
                        let c: usize = c.trim().parse().map_err(|_| {
                            format!("--mig-fixed-layout entry {item:?}: {c:?} is not a count")
                        })?;
                        (n.trim(), c)
                    }
                    None => (item, 1),
                };
                if name.is_empty() || count == 0 {
                    return Err(format!(
                        "--mig-fixed-layout entry {item:?}: needs a profile and a count of 1 or more"
                    ));
                }
                profiles.extend(std::iter::repeat_n(name.to_owned(), count));
            }
            match key {
                None if !layouts.all.is_empty() => {
                    return Err("--mig-fixed-layout: two groups for every GPU".into());
                }
                None => layouts.all = profiles,
                Some(k) => {
                    let r = GpuRef::parse(k)
                        .map_err(|e| format!("--mig-fixed-layout group {group:?}: {e}"))?;
                    if layouts.by_gpu.insert(r, profiles).is_some() {
                        return Err(format!("--mig-fixed-layout: GPU {k} is named twice"));
                    }
                }
            }
        }
        Ok(layouts)
    }
}

/// GPU-mode flags of `serve`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ModeArgs {
    /// The GPUs' modes: `shared` (quota shares), `mig` (MIG instances) or `whole`; one for
    /// every GPU (`mig`) and/or per GPU index or UUID (`0=mig,1=whole`). The node labels
    /// fgpu.dev/gpu-mode and fgpu.dev/gpu-mode-<index> win over it.
    #[arg(long, value_name = "MODES", default_value = "", env = "FGPU_GPU_MODE")]
    pub gpu_mode: ModeFlag,
    /// The research tier: GPUs whose granted memory may pass their memory by a ratio (a
    /// decimal above 1, at most 4; `1`: off the tier), for every GPU (`1.5`) and/or per
    /// GPU index or UUID (`0=1.5,1=2`). The node labels fgpu.dev/oversubscribe and
    /// fgpu.dev/oversubscribe-<index> win over it (docs/platforms.md).
    #[arg(
        long,
        value_name = "RATIOS",
        default_value = "",
        env = "FGPU_OVERSUBSCRIBE"
    )]
    pub oversubscribe: GpuFlag<TierRatio>,
    /// The MIG profiles to publish on each MIG-mode GPU where the API server has no
    /// partitionable devices: `1g.10gb*7`, or per GPU `0=3g.40gb,3g.40gb;1=7g.80gb`.
    #[arg(
        long,
        value_name = "LAYOUT",
        default_value = "",
        env = "FGPU_MIG_FIXED_LAYOUT"
    )]
    pub mig_fixed_layout: FixedLayouts,
}

/// Where a GPU's wanted mode came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModeSource {
    /// A node label (its key).
    Label(String),
    /// The `--gpu-mode` flag.
    Flag,
    /// The backend (the fake profile's `mode:`).
    Backend,
    /// Nothing set it: `shared`.
    Default,
}

impl ModeSource {
    /// Names the source in a message; `flag` is the setting's flag.
    fn describe(&self, flag: &str) -> String {
        match self {
            Self::Label(k) => format!("node label {k}"),
            Self::Flag => flag.to_owned(),
            Self::Backend => "the backend".to_owned(),
            Self::Default => "the default".to_owned(),
        }
    }
}

/// A GPU's wanted setting and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted<V = GpuMode> {
    /// The setting (the mode, the ratio).
    pub value: V,
    /// Its source.
    pub source: ModeSource,
}

/// The mode the admin wants for each GPU (by UUID), by the order of the module doc, and
/// the messages for label values that are not modes. `backend` gives the backend's say.
pub fn wanted_modes(
    gpus: &[Gpu],
    labels: &BTreeMap<String, String>,
    flag: &ModeFlag,
    backend: impl Fn(&str) -> Option<GpuMode>,
) -> (BTreeMap<String, Wanted>, Vec<String>) {
    let keys = LabelKeys {
        node: label::GPU_MODE,
        gpu_prefix: label::GPU_MODE_PREFIX,
    };
    wanted(gpus, labels, keys, flag, backend, GpuMode::Shared)
}

/// The node labels of a setting: one for every GPU, and a prefix for one GPU's (its index
/// follows).
#[derive(Clone, Copy, Debug)]
pub struct LabelKeys {
    /// Every GPU of the node.
    pub node: &'static str,
    /// One GPU: this and its index.
    pub gpu_prefix: &'static str,
}

/// The setting the admin wants for each GPU (by UUID), first found wins: the GPU's label,
/// the node's label, the flag's entry for the GPU, the flag's entry for every GPU, the
/// backend's say, `default`. Also the messages for label values that do not parse (each
/// names the label; the value is skipped).
pub fn wanted<V: Setting>(
    gpus: &[Gpu],
    labels: &BTreeMap<String, String>,
    keys: LabelKeys,
    flag: &GpuFlag<V>,
    backend: impl Fn(&str) -> Option<V>,
    default: V,
) -> (BTreeMap<String, Wanted<V>>, Vec<String>) {
    let mut errors = Vec::new();
    let mut from_label = |key: &str| -> Option<Wanted<V>> {
        let value = labels.get(key)?;
        match value.parse() {
            Ok(value) => Some(Wanted {
                value,
                source: ModeSource::Label(key.to_owned()),
            }),
            Err(e) => {
                errors.push(format!("node label {key}: {e}; ignored"));
                None
            }
        }
    };
    let node_wide = from_label(keys.node);
    let mut wanted = BTreeMap::new();
    for gpu in gpus {
        let per_gpu = from_label(&format!("{}{}", keys.gpu_prefix, gpu.index));
        let source = |value, source| Wanted { value, source };
        let w = per_gpu
            .or_else(|| node_wide.clone())
            .or_else(|| flag.for_gpu(gpu).map(|v| source(v, ModeSource::Flag)))
            .or_else(|| backend(&gpu.uuid).map(|v| source(v, ModeSource::Backend)))
            .unwrap_or(Wanted {
                value: default,
                source: ModeSource::Default,
            });
        wanted.insert(gpu.uuid.clone(), w);
    }
    (wanted, errors)
}

/// A change the plugin did not take: the GPU holds prepared claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal<V = GpuMode> {
    /// The GPU.
    pub gpu_uuid: String,
    /// The setting kept.
    pub from: V,
    /// The setting asked for, and by what.
    pub to: Wanted<V>,
    /// The prepared claims on the GPU (`namespace/name`).
    pub claims: Vec<String>,
}

impl<V: Setting> std::fmt::Display for Refusal<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let noun = V::NOUN;
        write!(
            f,
            "GPU {}: {noun} {} (from {}) not taken: the GPU holds prepared claims ({}); it stays in {noun} {} until they are gone",
            self.gpu_uuid,
            self.to.value,
            self.to.source.describe(V::FLAG),
            self.claims.join(", "),
            self.from
        )
    }
}

/// The settings in force, and the decision to take a wanted one.
#[derive(Debug)]
pub struct Keeper<V> {
    current: BTreeMap<String, V>,
    /// Refusals already reported (GPU, setting asked for): each is reported once.
    reported: BTreeSet<(String, String)>,
    /// Where the settings in force are kept; `None`: in memory only.
    file: Option<PathBuf>,
}

/// The GPU modes in force.
pub type ModeKeeper = Keeper<GpuMode>;

impl<V> Default for Keeper<V> {
    fn default() -> Self {
        Self {
            current: BTreeMap::new(),
            reported: BTreeSet::new(),
            file: None,
        }
    }
}

/// The mode keeper's file in the state directory.
pub const MODES_FILE: &str = "gpu-modes.json";

impl<V: Setting> Keeper<V> {
    /// A keeper with the settings recorded in `file` (none when it is missing); a file
    /// that does not parse is reported and read as none.
    pub fn load(file: PathBuf) -> (Self, Option<String>) {
        let mut note = None;
        let current = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                note = Some(format!(
                    "{}: not a map of GPU UUID to {} ({e}); starting without recorded values",
                    file.display(),
                    V::NOUN
                ));
                BTreeMap::new()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                note = Some(format!("{}: cannot read ({e})", file.display()));
                BTreeMap::new()
            }
        };
        (
            Self {
                current,
                reported: BTreeSet::new(),
                file: Some(file),
            },
            note,
        )
    }

    /// The settings in force, by GPU UUID.
    pub fn modes(&self) -> &BTreeMap<String, V> {
        &self.current
    }

    /// Records `value` as in force on each of `gpus` (UUIDs) with no record yet, so that
    /// [`Self::settle`] treats a change from it like any other (refused while the GPU holds
    /// claims) instead of taking the wanted setting at first sight.
    pub fn assume_unseen<'a>(&mut self, gpus: impl IntoIterator<Item = &'a str>, value: V) {
        for uuid in gpus {
            self.current.entry(uuid.to_owned()).or_insert(value);
        }
    }

    /// Takes each wanted setting unless the GPU holds prepared claims (`busy`: claims by
    /// GPU UUID) and has another setting now; returns the refusals not reported before, and
    /// an error when the keeper's file could not be written. A GPU seen for the first time
    /// takes its wanted setting.
    pub fn settle(
        &mut self,
        wanted: &BTreeMap<String, Wanted<V>>,
        busy: &BTreeMap<String, Vec<String>>,
    ) -> (Vec<Refusal<V>>, Option<String>) {
        let mut refusals = Vec::new();
        let mut changed = false;
        for (uuid, w) in wanted {
            let now = self.current.get(uuid).copied();
            if now == Some(w.value) {
                self.reported.retain(|(u, _)| u != uuid);
                continue;
            }
            let claims = busy.get(uuid).filter(|c| !c.is_empty());
            match (now, claims) {
                (Some(from), Some(claims)) => {
                    if self.reported.insert((uuid.clone(), w.value.to_string())) {
                        refusals.push(Refusal {
                            gpu_uuid: uuid.clone(),
                            from,
                            to: w.clone(),
                            claims: claims.clone(),
                        });
                    }
                }
                _ => {
                    self.current.insert(uuid.clone(), w.value);
                    self.reported.retain(|(u, _)| u != uuid);
                    changed = true;
                }
            }
        }
        let error = if changed { self.save().err() } else { None };
        (refusals, error)
    }

    fn save(&self) -> Result<(), String> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let text = serde_json::to_vec_pretty(&self.current).unwrap_or_default();
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("{}: cannot create ({e})", dir.display()))?;
        }
        write_atomic(file, &text, 0o644, Durability::Fsync)
            .map_err(|(step, e)| format!("{}: cannot write ({step}: {e})", file.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edits::tests::gpu;

    fn gpus() -> Vec<Gpu> {
        vec![gpu(0, "0000:1b:00.0"), gpu(1, "0000:2b:00.0")]
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn modes(w: &BTreeMap<String, Wanted>, gpus: &[Gpu]) -> Vec<GpuMode> {
        gpus.iter().map(|g| w[&g.uuid].value).collect()
    }

    #[test]
    fn mode_flags_parse_and_name_bad_entries() {
        let f: ModeFlag = "mig".parse().unwrap();
        assert_eq!(f.all, Some(GpuMode::Mig));
        let f: ModeFlag = "0=mig, 1=whole,GPU-ab=shared".parse().unwrap();
        assert_eq!(f.all, None);
        assert_eq!(f.by_gpu[&GpuRef::Index(0)], GpuMode::Mig);
        assert_eq!(f.by_gpu[&GpuRef::Index(1)], GpuMode::Whole);
        assert_eq!(f.by_gpu[&GpuRef::Uuid("GPU-ab".into())], GpuMode::Shared);
        assert_eq!("".parse::<ModeFlag>().unwrap(), ModeFlag::default());
        let e = "0=migg".parse::<ModeFlag>().unwrap_err();
        assert!(e.contains("\"migg\" is not a GPU mode"), "{e}");
        let e = "x=mig".parse::<ModeFlag>().unwrap_err();
        assert!(
            e.contains("x=mig") && e.contains("neither a GPU index"),
            "{e}"
        );
        assert!("0=mig,0=whole".parse::<ModeFlag>().is_err());
        assert!("mig,whole".parse::<ModeFlag>().is_err());
    }

    #[test]
    fn fixed_layouts_parse_counts_and_groups() {
        let l: FixedLayouts = "1g.10gb*3".parse().unwrap();
        assert_eq!(l.all, ["1g.10gb"; 3]);
        let l: FixedLayouts = "3g.40gb;0=3g.40gb,2g.20gb*2;GPU-x=7g.80gb".parse().unwrap();
        assert_eq!(l.all, ["3g.40gb"]);
        assert_eq!(
            l.by_gpu[&GpuRef::Index(0)],
            ["3g.40gb", "2g.20gb", "2g.20gb"]
        );
        let gs = gpus();
        assert_eq!(l.for_gpu(&gs[0]), ["3g.40gb", "2g.20gb", "2g.20gb"]);
        assert_eq!(l.for_gpu(&gs[1]), ["3g.40gb"]);
        assert!(
            "1g.10gb*x"
                .parse::<FixedLayouts>()
                .unwrap_err()
                .contains("not a count")
        );
        assert!("1g.10gb*0".parse::<FixedLayouts>().is_err());
        assert!("0=1g.10gb;0=2g.20gb".parse::<FixedLayouts>().is_err());
    }

    #[test]
    fn labels_win_over_the_flag_which_wins_over_the_backend() {
        let gs = gpus();
        let flag: ModeFlag = "whole,1=mig".parse().unwrap();
        let fake = |_: &str| Some(GpuMode::Mig);
        // The flag alone: per GPU, then for all.
        let (w, e) = wanted_modes(&gs, &labels(&[]), &flag, fake);
        assert!(e.is_empty());
        assert_eq!(modes(&w, &gs), [GpuMode::Whole, GpuMode::Mig]);
        assert_eq!(w[&gs[0].uuid].source, ModeSource::Flag);
        // The node label wins over the flag; the GPU's own label over the node's.
        let l = labels(&[
            ("fgpu.dev/gpu-mode", "shared"),
            ("fgpu.dev/gpu-mode-1", "mig"),
        ]);
        let (w, _) = wanted_modes(&gs, &l, &flag, fake);
        assert_eq!(modes(&w, &gs), [GpuMode::Shared, GpuMode::Mig]);
        assert_eq!(
            w[&gs[1].uuid].source,
            ModeSource::Label("fgpu.dev/gpu-mode-1".into())
        );
        // Nothing from the admin: the backend's, else shared.
        let (w, _) = wanted_modes(&gs, &labels(&[]), &ModeFlag::default(), fake);
        assert_eq!(modes(&w, &gs), [GpuMode::Mig, GpuMode::Mig]);
        assert_eq!(w[&gs[0].uuid].source, ModeSource::Backend);
        let (w, _) = wanted_modes(&gs, &labels(&[]), &ModeFlag::default(), |_| None);
        assert_eq!(modes(&w, &gs), [GpuMode::Shared, GpuMode::Shared]);
        // A bad label is named and skipped.
        let l = labels(&[("fgpu.dev/gpu-mode-0", "MIG")]);
        let (w, e) = wanted_modes(&gs, &l, &flag, fake);
        assert_eq!(modes(&w, &gs), [GpuMode::Whole, GpuMode::Mig]);
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("node label fgpu.dev/gpu-mode-0: \"MIG\" is not a GPU mode"),
            "{}",
            e[0]
        );
    }

    fn want(mode: GpuMode) -> Wanted {
        Wanted {
            value: mode,
            source: ModeSource::Flag,
        }
    }

    #[test]
    fn a_change_waits_for_the_gpu_to_hold_no_claim_and_survives_a_restart() {
        let dir = std::env::temp_dir().join(format!("fgpu-modes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = dir.join(MODES_FILE);
        let (mut k, note) = ModeKeeper::load(file.clone());
        assert_eq!(note, None);
        let a = "GPU-a".to_owned();
        let b = "GPU-b".to_owned();
        let mut wanted = BTreeMap::from([
            (a.clone(), want(GpuMode::Shared)),
            (b.clone(), want(GpuMode::Shared)),
        ]);
        let busy = BTreeMap::from([(a.clone(), vec!["ns/c1".to_owned()])]);
        // First sight: taken, busy or not.
        let (r, e) = k.settle(&wanted, &busy);
        assert!(r.is_empty() && e.is_none());
        // A change on the busy GPU is refused (once), the idle one changes.
        wanted.insert(a.clone(), want(GpuMode::Mig));
        wanted.insert(b.clone(), want(GpuMode::Mig));
        let (r, _) = k.settle(&wanted, &busy);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].from, r[0].to.value), (GpuMode::Shared, GpuMode::Mig));
        assert_eq!(
            r[0].to_string(),
            "GPU GPU-a: mode mig (from --gpu-mode) not taken: the GPU holds prepared claims (ns/c1); it stays in mode shared until they are gone"
        );
        assert_eq!(k.modes()[&a], GpuMode::Shared);
        assert_eq!(k.modes()[&b], GpuMode::Mig);
        assert!(k.settle(&wanted, &busy).0.is_empty(), "reported once");
        // A restarted plugin keeps the mode in force, and still refuses.
        let (mut k, _) = ModeKeeper::load(file.clone());
        assert_eq!(k.modes()[&a], GpuMode::Shared);
        let (r, _) = k.settle(&wanted, &busy);
        assert_eq!(r.len(), 1);
        // Once the claim is gone the change is taken.
        let (r, _) = k.settle(&wanted, &BTreeMap::new());
        assert!(r.is_empty());
        assert_eq!(k.modes()[&a], GpuMode::Mig);
        // A file that does not parse is reported, not fatal.
        std::fs::write(&file, "nonsense").unwrap();
        let (k, note) = ModeKeeper::load(file);
        assert!(k.modes().is_empty());
        assert!(
            note.unwrap()
                .contains("gpu-modes.json: not a map of GPU UUID to mode")
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
