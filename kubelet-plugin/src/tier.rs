//! The oversubscribed research tier: which GPUs are on it, at what ratio, and what a claim
//! may get on them.
//!
//! The admin marks a GPU for the tier with its oversubscription ratio ([`TierRatio`], e.g.
//! `1.5`), first found wins, as for the GPU mode ([`crate::gpu_mode`]):
//!
//! 1. the node label `fgpu.dev/oversubscribe-<index>` (one GPU; `1` takes it out);
//! 2. the node label `fgpu.dev/oversubscribe` (every GPU of the node);
//! 3. the flag `--oversubscribe` entry for the GPU's index or UUID (`0=1.5,GPU-…=2`);
//! 4. the flag's entry without a key (every GPU);
//! 5. `1`: not on the tier.
//!
//! A value that is not a ratio is reported (naming the label or entry) and skipped. A
//! change is taken only while the GPU holds no prepared claim ([`TierKeeper`], the mode
//! keeper's rule), and the ratios in force are kept in the state directory
//! ([`TIERS_FILE`]). Unlike a mode, a GPU the keeper has no record of is taken to be off the
//! tier (`Keeper::assume_unseen`): its claims were prepared as production ones.
//!
//! A tier GPU is published with `memory` capacity physical × ratio and the attributes
//! `tier: research`, `physicalMemory` and `oversubscribeRatio` (see [`crate::slices`]);
//! other GPUs carry `tier: production`. At prepare, [`check`] keeps the tiers apart: an
//! oversubscribed share (`oversubscribe: true`, which only the research class sets) goes
//! only to a tier GPU, a tier GPU takes only oversubscribed shares, and a claim's grants on
//! a tier GPU stay within physical × ratio. The limits file then tells the shim the
//! physical part of the grant (`gpu.<UUID>.physical`), past which it serves allocations
//! with managed memory.

use std::collections::BTreeMap;

use fgpu_api::names::label;
use fgpu_driver::device::{Gpu, TierRatio};

use crate::edits::{ClaimRef, EditsError, PlannedDevice};
use crate::gpu_mode::{GpuFlag, Keeper, LabelKeys, Setting, Wanted, wanted};

impl Setting for TierRatio {
    const NOUN: &'static str = "oversubscribe ratio";
    const FLAG: &'static str = "--oversubscribe";
}

/// The `--oversubscribe` flag: a ratio for every GPU and/or per GPU.
pub type TierFlag = GpuFlag<TierRatio>;

/// The ratios in force, by GPU UUID, and the refusal of a change on a GPU with claims.
pub type TierKeeper = Keeper<TierRatio>;

/// The tier keeper's file in the state directory.
pub const TIERS_FILE: &str = "gpu-tiers.json";

/// The ratio the admin wants for each GPU (by UUID), by the order of the module doc, and
/// the messages for label values that are not ratios.
pub fn wanted_tiers(
    gpus: &[Gpu],
    labels: &BTreeMap<String, String>,
    flag: &TierFlag,
) -> (BTreeMap<String, Wanted<TierRatio>>, Vec<String>) {
    let keys = LabelKeys {
        node: label::OVERSUBSCRIBE,
        gpu_prefix: label::OVERSUBSCRIBE_PREFIX,
    };
    wanted(gpus, labels, keys, flag, |_| None, TierRatio::NONE)
}

/// Keeps the tiers apart on the claim's `planned` devices (MIG instances are never on the
/// tier) and sets each device's ratio from `tiers` (by GPU UUID; a GPU not in it is off the
/// tier). `results` are the devices' result indices, in the same order. Refuses, naming
/// the claim and the result: an oversubscribed share on a GPU off the tier, a share that is
/// not oversubscribed on a tier GPU, and grants of the claim on a tier GPU past physical ×
/// ratio.
pub fn check(
    claim: &ClaimRef,
    planned: &mut [PlannedDevice],
    results: &[usize],
    tiers: &BTreeMap<String, TierRatio>,
) -> Result<(), EditsError> {
    let mut granted: BTreeMap<String, u64> = BTreeMap::new();
    for (d, &index) in planned.iter_mut().zip(results) {
        if d.mig.is_some() {
            continue;
        }
        let ratio = tiers.get(&d.gpu.uuid).copied().unwrap_or_default();
        match (d.oversubscribe, ratio.is_tier()) {
            (true, false) => {
                return Err(EditsError::OversubscribedOffTier {
                    claim: claim.key(),
                    index,
                    device: d.device.clone(),
                });
            }
            (false, true) => {
                return Err(EditsError::NotOversubscribedOnTier {
                    claim: claim.key(),
                    index,
                    device: d.device.clone(),
                    ratio: ratio.to_string(),
                });
            }
            _ => {}
        }
        d.tier = ratio;
        if !ratio.is_tier() {
            continue;
        }
        let sum = granted.entry(d.gpu.uuid.clone()).or_default();
        *sum = sum.saturating_add(d.memory_bytes);
        let capacity = ratio.capacity(d.gpu.memory_bytes);
        if *sum > capacity {
            return Err(EditsError::MemoryAboveTier {
                claim: claim.key(),
                index,
                device: d.device.clone(),
                granted: *sum,
                capacity,
                ratio: ratio.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edits::tests::{gpu, planned_share};

    const GI: u64 = 1 << 30;

    fn claim() -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u1".into(),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn ratios_come_from_labels_then_the_flag_and_bad_ones_are_named() {
        let gs = vec![gpu(0, "0000:1b:00.0"), gpu(1, "0000:2b:00.0")];
        let flag: TierFlag = "1=2".parse().unwrap();
        let (w, e) = wanted_tiers(&gs, &labels(&[]), &flag);
        assert!(e.is_empty());
        assert_eq!(w[&gs[0].uuid].value, TierRatio::NONE);
        assert_eq!(w[&gs[1].uuid].value.to_string(), "2");
        let l = labels(&[
            ("fgpu.dev/oversubscribe", "1.5"),
            ("fgpu.dev/oversubscribe-1", "1"),
        ]);
        let (w, _) = wanted_tiers(&gs, &l, &flag);
        assert_eq!(w[&gs[0].uuid].value.to_string(), "1.5");
        assert_eq!(w[&gs[1].uuid].value, TierRatio::NONE, "the GPU's own label");
        let l = labels(&[("fgpu.dev/oversubscribe-0", "9")]);
        let (w, e) = wanted_tiers(&gs, &l, &TierFlag::default());
        assert_eq!(w[&gs[0].uuid].value, TierRatio::NONE);
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with(
                "node label fgpu.dev/oversubscribe-0: \"9\" is not an oversubscription ratio"
            ),
            "{}",
            e[0]
        );
        let e = "0=0.5".parse::<TierFlag>().unwrap_err();
        assert!(e.starts_with("--oversubscribe entry \"0.5\""), "{e}");
    }

    #[test]
    fn a_ratio_change_waits_for_the_gpu_to_hold_no_claim() {
        let mut k = TierKeeper::default();
        let a = "GPU-a".to_owned();
        let want = |v: &str| {
            BTreeMap::from([(
                a.clone(),
                Wanted {
                    value: v.parse::<TierRatio>().unwrap(),
                    source: crate::gpu_mode::ModeSource::Label("fgpu.dev/oversubscribe".into()),
                },
            )])
        };
        let busy = BTreeMap::from([(a.clone(), vec!["ns/c1".to_owned()])]);
        assert!(k.settle(&want("1"), &busy).0.is_empty());
        let (r, _) = k.settle(&want("1.5"), &busy);
        assert_eq!(
            r[0].to_string(),
            "GPU GPU-a: oversubscribe ratio 1.5 (from node label fgpu.dev/oversubscribe) not taken: the GPU holds prepared claims (ns/c1); it stays in oversubscribe ratio 1 until they are gone"
        );
        assert_eq!(k.modes()[&a], TierRatio::NONE);
        k.settle(&want("1.5"), &BTreeMap::new());
        assert_eq!(k.modes()[&a].to_string(), "1.5");
        // A GPU with claims and no record (a plugin without tiers prepared them) is
        // assumed off the tier: labelling it waits for its claims.
        let mut k = TierKeeper::default();
        k.assume_unseen([a.as_str()], TierRatio::NONE);
        let (r, _) = k.settle(&want("1.5"), &busy);
        assert_eq!(r.len(), 1);
        assert_eq!(k.modes()[&a], TierRatio::NONE);
    }

    fn tiers(g: &Gpu, ratio: &str) -> BTreeMap<String, TierRatio> {
        BTreeMap::from([(g.uuid.clone(), ratio.parse().unwrap())])
    }

    #[test]
    fn an_oversubscribed_share_goes_only_to_a_tier_gpu() {
        let g = gpu(0, "0000:1b:00.0");
        let mut p = vec![planned_share(&g, 10 * GI, true)];
        let e = check(&claim(), &mut p, &[2], &BTreeMap::new()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "claim ns/c: status.allocation.devices.results[2]: an oversubscribed share (oversubscribe: true) on gpu-0, which is not on the research tier (no fgpu.dev/oversubscribe label); oversubscribed shares go to research-tier GPUs only"
        );
        assert!(check(&claim(), &mut p, &[2], &tiers(&g, "1.5")).is_ok());
        assert_eq!(p[0].tier.to_string(), "1.5");
    }

    #[test]
    fn a_tier_gpu_takes_only_oversubscribed_shares() {
        let g = gpu(0, "0000:1b:00.0");
        let mut p = vec![planned_share(&g, 10 * GI, false)];
        let e = check(&claim(), &mut p, &[0], &tiers(&g, "1.5")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "claim ns/c: status.allocation.devices.results[0].device: gpu-0 is on the research tier (oversubscribe ratio 1.5), and this share does not set oversubscribe: true; only claims of the research class (research.<driver>) go to research-tier GPUs"
        );
        assert!(check(&claim(), &mut p, &[0], &BTreeMap::new()).is_ok());
        assert_eq!(p[0].tier, TierRatio::NONE);
    }

    #[test]
    fn grants_on_a_tier_gpu_stay_within_physical_times_ratio() {
        // The test GPU has 80 GiB: 120 GiB at 1.5.
        let g = gpu(0, "0000:1b:00.0");
        let mut p = vec![
            planned_share(&g, 60 * GI, true),
            planned_share(&g, 60 * GI, true),
        ];
        assert!(check(&claim(), &mut p, &[0, 1], &tiers(&g, "1.5")).is_ok());
        p.push(planned_share(&g, 1, true));
        let e = check(&claim(), &mut p, &[0, 1, 2], &tiers(&g, "1.5")).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "claim ns/c: status.allocation.devices.results[2]: grants {} bytes of memory on gpu-0, more than its {} (its physical memory times its oversubscribe ratio 1.5)",
                120 * GI + 1,
                120 * GI
            )
        );
    }
}
