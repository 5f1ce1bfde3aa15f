//! NVIDIA's MIG profile tables, one per GPU model, and the lookup of a GPU's table.
//!
//! Each [`MigTable`] lists a model's GPU instance profiles as NVIDIA's MIG user guide gives
//! them ("Supported MIG Profiles",
//! <https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html>;
//! the GPU list in "Supported GPUs",
//! <https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-gpus.html>): the
//! profile name, its memory slices (eighths of the memory; quarters on the A30), its compute
//! slices (GPCs: sevenths of the SMs; quarters on the A30), the most instances of it one GPU
//! holds, and the memory slices an instance may start at (NVML's placements, `nvidia-smi
//! mig -lgipp`, as `{starts}:size`; the size is always the profile's memory slices).
//!
//! What was confirmed and what was not:
//! * Names, fractions and instance counts: the user guide's tables for every model here.
//! * Placements: the user guide prints `nvidia-smi mig -lgipp` for an A100 / H100 (profile
//!   ids 19, 20, 15, 14, 9, 5, 0 → `{0..6}:1`, `{0..6}:1`, `{0,2,4,6}:2`, `{0,2,4}:2`,
//!   `{0,4}:4`, `{0}:4`, `{0}:8`). The H200 and B200 have the same geometry (8 memory
//!   slices, 7 GPCs, the same seven profiles with the same instance counts); their
//!   placements are taken to be the same, not read from a listing of theirs. The A30's
//!   (`{0,1,2,3}:1`, `{0,2}:2`, `{0}:4`) follow from its four slices and instance counts,
//!   also not read from a listing. `docs/mig.md` says how to check them on a real GPU.
//! * Memory: the size in the profile's name, read as GiB ([`MigProfile::memory_bytes`]).
//!   The driver reports a little less (an H100's `1g.10gb` shows 9.75 GiB in `nvidia-smi mig
//!   -lgip`); requests are matched against the name's size, as HAMi does.

use crate::device::GIB;

/// One GPU instance profile of a model (e.g. the H100's `1g.10gb`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigProfile {
    /// The name as NVIDIA writes it, e.g. `1g.10gb` or `1g.10gb+me`.
    pub name: &'static str,
    /// Memory slices an instance occupies (its placements' size).
    pub memory_slices: u8,
    /// Compute slices (GPCs) an instance takes.
    pub compute_slices: u8,
    /// The memory in the profile's name, in GiB (`10` for `1g.10gb`).
    pub memory_gib: u32,
    /// The most instances of this profile one GPU holds.
    pub max_instances: u8,
    /// The memory slices an instance may start at.
    pub starts: &'static [u8],
    /// Whether the profile takes the GPU's media extensions (`+me`: the decoders, JPEG and
    /// OFA units that only one instance at a time can have).
    pub media_extensions: bool,
}

impl MigProfile {
    /// The memory of the profile in bytes: the name's size as GiB.
    pub fn memory_bytes(&self) -> u64 {
        u64::from(self.memory_gib) * GIB
    }

    /// The profile's valid placements, in start order.
    pub fn placements(&self) -> impl Iterator<Item = Placement> + '_ {
        self.starts.iter().map(|&start| Placement {
            start,
            size: self.memory_slices,
        })
    }

    /// Whether the profile trades compute for memory: two or more memory slices per compute
    /// slice (`1g.20gb` on an H100). Such a profile leaves compute slices that no other
    /// instance can use once the memory is gone, so a request that names no compute slices
    /// is not given one (see [`super::choose`](mod@super::choose)).
    pub fn memory_heavy(&self) -> bool {
        self.memory_slices >= 2 * self.compute_slices
    }

    /// The profile's name as a DNS label, for device names: `1g.10gb+me` → `1g10gbme`.
    pub fn label(&self) -> String {
        self.name
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect()
    }
}

/// A range of memory slices an instance occupies: NVML's `nvmlGpuInstancePlacement_t`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Placement {
    /// The first memory slice.
    pub start: u8,
    /// The number of memory slices.
    pub size: u8,
}

impl Placement {
    /// The memory slices as a bit mask (bit `i`: slice `i`).
    pub fn mask(self) -> u32 {
        (((1u64 << self.size) - 1) << self.start) as u32
    }

    /// The memory slices, in order.
    pub fn slices(self) -> std::ops::Range<u8> {
        self.start..self.start + self.size
    }
}

impl std::fmt::Display for Placement {
    /// As `nvidia-smi mig -lgipp` writes one placement: `{4}:4`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{{{}}}:{}", self.start, self.size)
    }
}

/// The MIG profiles of one GPU model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigTable {
    /// The model, as the tables name it (`H100 80GB`).
    pub model: &'static str,
    /// The word of the product name that names the model (`H100` in `NVIDIA H100 80GB HBM3`).
    pub family: &'static str,
    /// The range of total memory (GiB, as NVML reports it) that tells this model from
    /// others of its family (an A100 40GB from an A100 80GB, an H100 80GB from the 94GB).
    pub memory_gib: (u32, u32),
    /// The GPU's memory slices.
    pub memory_slices: u8,
    /// The GPU's compute slices (GPCs available to MIG).
    pub compute_slices: u8,
    /// The profiles, smallest first.
    pub profiles: &'static [MigProfile],
}

impl MigTable {
    /// The profile called `name`.
    pub fn profile(&self, name: &str) -> Option<&'static MigProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// The profile names, in table order, for messages.
    pub fn profile_names(&self) -> Vec<&'static str> {
        self.profiles.iter().map(|p| p.name).collect()
    }
}

/// A profile row; the `me` flag is derived from the name.
const fn p(
    name: &'static str,
    memory_slices: u8,
    compute_slices: u8,
    memory_gib: u32,
    max_instances: u8,
    starts: &'static [u8],
) -> MigProfile {
    let b = name.as_bytes();
    let media_extensions = b.len() > 3 && b[b.len() - 3] == b'+';
    MigProfile {
        name,
        memory_slices,
        compute_slices,
        memory_gib,
        max_instances,
        starts,
        media_extensions,
    }
}

// Placements shared by every model with 8 memory slices and 7 GPCs (see the module doc).
const ONE: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const TWO: &[u8] = &[0, 2, 4, 6];
const TWO_2G: &[u8] = &[0, 2, 4];
const FOUR_3G: &[u8] = &[0, 4];
const WHOLE: &[u8] = &[0];

/// The seven profiles of an 8-slice, 7-GPC GPU, named by `names` in table order (1g,
/// 1g+me, 1g on two slices, 2g, 3g, 4g, 7g) with `gib` the memory in their names: one
/// slice, two slices, four slices, all of it.
const fn eighths(names: [&'static str; 7], gib: [u32; 4]) -> [MigProfile; 7] {
    [
        p(names[0], 1, 1, gib[0], 7, ONE),
        p(names[1], 1, 1, gib[0], 1, ONE),
        p(names[2], 2, 1, gib[1], 4, TWO),
        p(names[3], 2, 2, gib[1], 3, TWO_2G),
        p(names[4], 4, 3, gib[2], 2, FOUR_3G),
        p(names[5], 4, 4, gib[2], 1, WHOLE),
        p(names[6], 8, 7, gib[3], 1, WHOLE),
    ]
}

/// A100 40GB (SXM4 and PCIe).
const A100_40GB: [MigProfile; 7] = eighths(
    [
        "1g.5gb",
        "1g.5gb+me",
        "1g.10gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
    ],
    [5, 10, 20, 40],
);

/// A100 80GB: the 40GB's profiles with the memory doubled (user guide).
const A100_80GB: [MigProfile; 7] = eighths(
    [
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ],
    [10, 20, 40, 80],
);

/// H100 80GB (SXM5 and PCIe).
const H100_80GB: [MigProfile; 7] = A100_80GB;

/// H200 141GB (SXM5 and NVL).
const H200_141GB: [MigProfile; 7] = eighths(
    [
        "1g.18gb",
        "1g.18gb+me",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    ],
    [18, 35, 71, 141],
);

/// B200 180GB.
const B200_180GB: [MigProfile; 7] = eighths(
    [
        "1g.23gb",
        "1g.23gb+me",
        "1g.45gb",
        "2g.45gb",
        "3g.90gb",
        "4g.90gb",
        "7g.180gb",
    ],
    [23, 45, 90, 180],
);

/// A30 24GB: four memory slices and four compute slices; `2g.12gb+me` needs R525 or newer.
/// Placements not read from a listing (see the module doc).
const A30_24GB: [MigProfile; 5] = [
    p("1g.6gb", 1, 1, 6, 4, &[0, 1, 2, 3]),
    p("1g.6gb+me", 1, 1, 6, 1, &[0, 1, 2, 3]),
    p("2g.12gb", 2, 2, 12, 2, &[0, 2]),
    p("2g.12gb+me", 2, 2, 12, 1, &[0, 2]),
    p("4g.24gb", 4, 4, 24, 1, &[0]),
];

/// Every model fgpu knows the MIG profiles of.
pub static TABLES: [MigTable; 6] = [
    MigTable {
        model: "A100 40GB",
        family: "A100",
        memory_gib: (32, 48),
        memory_slices: 8,
        compute_slices: 7,
        profiles: &A100_40GB,
    },
    MigTable {
        model: "A100 80GB",
        family: "A100",
        memory_gib: (72, 88),
        memory_slices: 8,
        compute_slices: 7,
        profiles: &A100_80GB,
    },
    MigTable {
        model: "A30 24GB",
        family: "A30",
        memory_gib: (20, 28),
        memory_slices: 4,
        compute_slices: 4,
        profiles: &A30_24GB,
    },
    MigTable {
        model: "H100 80GB",
        family: "H100",
        // 79.6 GiB reported; the 94 GB (NVL) and 96 GB (GH200) parts have other profiles.
        memory_gib: (72, 88),
        memory_slices: 8,
        compute_slices: 7,
        profiles: &H100_80GB,
    },
    MigTable {
        model: "H200 141GB",
        family: "H200",
        memory_gib: (130, 150),
        memory_slices: 8,
        compute_slices: 7,
        profiles: &H200_141GB,
    },
    MigTable {
        model: "B200 180GB",
        family: "B200",
        memory_gib: (170, 196),
        memory_slices: 8,
        compute_slices: 7,
        profiles: &B200_180GB,
    },
];

/// The table of the GPU called `product` (NVML's name) with `memory_bytes` of memory: the
/// model whose family is a word of the name (split at spaces and dashes, any case) and whose
/// memory range holds the memory. An unknown GPU is an error naming it, never a guess.
pub fn table_for(product: &str, memory_bytes: u64) -> Result<&'static MigTable, UnknownModel> {
    let gib = memory_bytes as f64 / GIB as f64;
    let words = family_words(product);
    TABLES
        .iter()
        .find(|t| {
            words.iter().any(|w| w == t.family)
                && (f64::from(t.memory_gib.0)..=f64::from(t.memory_gib.1)).contains(&gib)
        })
        .ok_or_else(|| UnknownModel {
            product: product.to_owned(),
            memory_gib: gib,
        })
}

/// The tables a MIG-mode GPU called `product` may have, known only by the profiles it
/// publishes (`profiles`: name and memory in bytes), as a cluster-side reader sees its
/// placement devices: the models whose family is a word of the name and that have every
/// one of the profiles with that memory. One table for a GPU that publishes its whole
/// table (the placements of an A100 40GB and an 80GB differ by their `7g` profile); maybe
/// several for a fixed layout of small profiles, which the caller must refuse.
pub fn tables_with_profiles<'a>(
    product: &str,
    profiles: impl IntoIterator<Item = (&'a str, u64)> + Clone,
) -> Vec<&'static MigTable> {
    let words = family_words(product);
    TABLES
        .iter()
        .filter(|t| words.iter().any(|w| w == t.family))
        .filter(|t| {
            profiles
                .clone()
                .into_iter()
                .all(|(name, bytes)| t.profile(name).is_some_and(|p| p.memory_bytes() == bytes))
        })
        .collect()
}

/// The words of a product name that may name a model's family (upper case).
fn family_words(product: &str) -> Vec<String> {
    product
        .split([' ', '-', '_'])
        .map(str::to_ascii_uppercase)
        .collect()
}

/// A GPU with no MIG profile table.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error(
    "no MIG profile table for {product:?} with {memory_gib:.1} GiB; fgpu knows {}",
    known_models()
)]
pub struct UnknownModel {
    /// The product name.
    pub product: String,
    /// Its memory in GiB.
    pub memory_gib: f64,
}

fn known_models() -> String {
    TABLES
        .iter()
        .map(|t| t.model)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_found_by_the_profiles_a_gpu_publishes() {
        let all = |product: &str, gib: u64| -> Vec<(&'static str, u64)> {
            table_for(product, gib * GIB)
                .unwrap()
                .profiles
                .iter()
                .map(|p| (p.name, p.memory_bytes()))
                .collect()
        };
        let models = |product: &str, profiles: &[(&str, u64)]| -> Vec<&'static str> {
            tables_with_profiles(product, profiles.iter().copied())
                .iter()
                .map(|t| t.model)
                .collect()
        };
        // A whole table names one model.
        let a100_40 = all("NVIDIA A100-SXM4-40GB", 40);
        assert_eq!(models("NVIDIA A100-SXM4-40GB", &a100_40), ["A100 40GB"]);
        let a100_80 = all("NVIDIA A100-SXM4-80GB", 80);
        assert_eq!(models("NVIDIA A100-SXM4-80GB", &a100_80), ["A100 80GB"]);
        let h100 = all("NVIDIA H100 80GB HBM3", 80);
        assert_eq!(models("NVIDIA H100 80GB HBM3", &h100), ["H100 80GB"]);
        // The family comes from the product: the H100's profiles on an "A100" are the
        // A100 80GB's.
        assert_eq!(models("NVIDIA A100 80GB PCIe", &h100), ["A100 80GB"]);
        // A small fixed layout may fit two models of a family; a profile no model of the
        // family has fits none, nor does a known name with another size.
        assert_eq!(
            models("NVIDIA A100-PCIE", &[("1g.10gb", 10 * GIB)]),
            ["A100 40GB", "A100 80GB"]
        );
        assert!(models("NVIDIA H100 80GB HBM3", &[("1g.5gb", 5 * GIB)]).is_empty());
        assert!(models("NVIDIA H100 80GB HBM3", &[("1g.10gb", 9 * GIB)]).is_empty());
        assert!(models("NVIDIA L4", &[("1g.10gb", 10 * GIB)]).is_empty());
    }

    #[test]
    fn products_map_to_their_tables() {
        let mib = |m: u64| m << 20;
        let cases = [
            ("NVIDIA A100-SXM4-40GB", mib(40960), "A100 40GB"),
            ("NVIDIA A100-PCIE-40GB", mib(40960), "A100 40GB"),
            ("NVIDIA A100-SXM4-80GB", mib(81920), "A100 80GB"),
            ("NVIDIA A100 80GB PCIe", mib(81920), "A100 80GB"),
            ("NVIDIA A30", mib(24576), "A30 24GB"),
            ("NVIDIA H100 80GB HBM3", mib(81559), "H100 80GB"),
            ("NVIDIA H100 PCIe", mib(81559), "H100 80GB"),
            ("NVIDIA H200", mib(143_771), "H200 141GB"),
            ("NVIDIA H200 NVL", mib(143_771), "H200 141GB"),
            ("NVIDIA B200", mib(183_359), "B200 180GB"),
        ];
        for (product, memory, model) in cases {
            assert_eq!(
                table_for(product, memory).unwrap().model,
                model,
                "{product}"
            );
        }
    }

    #[test]
    fn unknown_gpus_are_named_not_guessed() {
        // The 94 GB H100 NVL has other profiles (1g.12gb ...); a GH200 is not an H200.
        let e = table_for("NVIDIA H100 NVL", 95_830 << 20).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no MIG profile table for \"NVIDIA H100 NVL\" with 93.6 GiB; fgpu knows A100 40GB, A100 80GB, A30 24GB, H100 80GB, H200 141GB, B200 180GB"
        );
        assert!(table_for("NVIDIA GH200 480GB", 97_871 << 20).is_err());
        assert!(table_for("NVIDIA L40S", 46_068 << 20).is_err());
    }

    #[test]
    fn tables_are_consistent() {
        for t in &TABLES {
            let mut whole = 0;
            for p in t.profiles {
                assert!(
                    p.compute_slices <= t.compute_slices,
                    "{} {}",
                    t.model,
                    p.name
                );
                assert!(p.max_instances as usize <= p.starts.len());
                for pl in p.placements() {
                    assert!(
                        pl.start + pl.size <= t.memory_slices,
                        "{} {}",
                        t.model,
                        p.name
                    );
                    assert_eq!(pl.start % pl.size.min(4), 0, "{} {} {pl}", t.model, p.name);
                }
                // The name says the compute slices and the memory.
                let (g, mem) = p.name.split_once('.').unwrap();
                assert_eq!(g, format!("{}g", p.compute_slices));
                assert!(
                    mem.starts_with(&format!("{}gb", p.memory_gib)),
                    "{}",
                    p.name
                );
                assert_eq!(p.media_extensions, p.name.ends_with("+me"));
                if p.memory_slices == t.memory_slices {
                    whole += 1;
                }
            }
            assert_eq!(whole, 1, "{}: one profile takes the whole GPU", t.model);
        }
        let h100 = table_for("NVIDIA H100 80GB HBM3", 80 * GIB).unwrap();
        let p = h100.profile("1g.20gb").unwrap();
        assert!(p.memory_heavy() && !h100.profile("2g.20gb").unwrap().memory_heavy());
        assert!(!h100.profile("3g.40gb").unwrap().memory_heavy());
        assert_eq!(h100.profile("1g.10gb+me").unwrap().label(), "1g10gbme");
        assert_eq!(Placement { start: 4, size: 4 }.mask(), 0b1111_0000);
        assert_eq!(Placement { start: 4, size: 4 }.to_string(), "{4}:4");
    }
}
