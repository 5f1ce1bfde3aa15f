//! Choosing a MIG profile and placement for a request, on one GPU or across several.
//!
//! The rule (also in `docs/mig.md`):
//!
//! 1. **Profile**: the smallest profile that holds the request: the fewest memory slices,
//!    then the fewest compute slices, among those whose memory (the size in the name) is at
//!    least the request's and, when the request names compute slices, whose compute slices
//!    are at least those. A request that names no compute slices is not given a
//!    memory-heavy profile ([`MigProfile::memory_heavy`], e.g. `1g.20gb`): four of those
//!    fill an H100's memory and leave three compute slices no one can use, so 20 GiB gets
//!    `2g.20gb`. `+me` profiles are never chosen (the media extensions are asked for by
//!    profile name). When the smallest profile has no free placement, the next one is
//!    tried.
//! 2. **Placement**: among the profile's free placements, the one after which the GPU keeps
//!    the most room for large profiles: the [`FreeScore`] (free placements of each profile,
//!    the largest profile first) is compared lexicographically, so the largest profile still
//!    placeable comes first, then how many placements of each size are left. A tie goes to
//!    the higher start slice (small instances fill from the top, away from slice 0 where
//!    the whole-GPU and half-GPU profiles start).
//! 3. **Across GPUs**: each GPU's choice by 1 and 2, then the GPU whose profile wastes the
//!    least memory over the request, then the GPU with the fewest free memory slices (fill a
//!    used GPU before cutting into an empty one, which stays whole for large requests), then
//!    the largest profile left placeable after, then the lowest position.

use super::layout::{FreeScore, MigError, MigLayout};
use super::profiles::{MigProfile, MigTable, Placement};
use crate::device::GIB;

/// What a claim asks of a MIG instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigRequest {
    /// Device memory, in bytes.
    pub memory_bytes: u64,
    /// Compute slices (GPCs), if the request names them.
    pub compute_slices: Option<u8>,
}

impl std::fmt::Display for MigRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "memory {:.1} GiB", self.memory_bytes as f64 / GIB as f64)?;
        if let Some(c) = self.compute_slices {
            write!(f, ", {c} compute slices")?;
        }
        Ok(())
    }
}

/// A profile and a placement for a request on one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigChoice {
    /// The profile.
    pub profile: &'static MigProfile,
    /// Where the instance goes.
    pub placement: Placement,
    /// The GPU's free placements per profile after taking it.
    pub after: FreeScore,
    /// The largest profile still placeable after taking it.
    pub largest_after: Option<&'static MigProfile>,
}

/// The profiles of `table` that would hold `request`, the smallest first (rule 1 of the
/// module doc); [`MigError::TooLarge`] when there is none.
pub fn candidates(
    table: &'static MigTable,
    request: &MigRequest,
) -> Result<Vec<&'static MigProfile>, MigError> {
    let mut fit: Vec<&'static MigProfile> = table
        .profiles
        .iter()
        .filter(|p| !p.media_extensions && p.memory_bytes() >= request.memory_bytes)
        .filter(|p| match request.compute_slices {
            Some(c) => p.compute_slices >= c,
            None => !p.memory_heavy(),
        })
        .collect();
    fit.sort_by_key(|p| (p.memory_slices, p.compute_slices, p.memory_gib));
    if fit.is_empty() {
        let largest = table
            .profiles
            .iter()
            .max_by_key(|p| (p.memory_slices, p.compute_slices))
            .map_or("none", |p| p.name);
        return Err(MigError::TooLarge {
            model: table.model,
            request: request.to_string(),
            largest,
        });
    }
    Ok(fit)
}

/// The profile a request of `memory_mib` MiB (and `compute_slices`, when named) gets on a
/// GPU of model `table`: rule 1's smallest fitting profile, whatever is free. This is the
/// legacy path's mapping of `nvidia.com/gpumem` on a MIG-mode GPU, as HAMi maps it (the
/// smallest profile whose memory holds the request); 0 MiB gets the smallest profile.
pub fn profile_for_mib(
    table: &'static MigTable,
    memory_mib: u64,
    compute_slices: Option<u8>,
) -> Result<&'static MigProfile, MigError> {
    let request = MigRequest {
        memory_bytes: memory_mib.saturating_mul(1 << 20),
        compute_slices,
    };
    Ok(candidates(table, &request)?[0])
}

/// The profile and placement for `request` on the GPU `layout` (rules 1 and 2).
pub fn choose(layout: &MigLayout, request: &MigRequest) -> Result<MigChoice, MigError> {
    choose_where(layout, request, &|_, _| true)
}

/// [`choose`] among the placements `allowed` accepts (profile, start): a claim's
/// selectors, the devices a node publishes.
pub fn choose_where(
    layout: &MigLayout,
    request: &MigRequest,
    allowed: &dyn Fn(&MigProfile, u8) -> bool,
) -> Result<MigChoice, MigError> {
    let profiles = candidates(layout.table(), request)?;
    for &profile in &profiles {
        if let Some(best) = place_where(layout, profile, allowed) {
            return Ok(best);
        }
    }
    Err(MigError::NoFreePlacement {
        model: layout.table().model,
        request: request.to_string(),
        tried: profiles.iter().map(|p| p.name).collect(),
    })
}

/// The best free placement of `profile` on the GPU `layout` (rule 2), `None` when it has
/// none. Also places the profiles of an admin's fixed layout, named rather than chosen.
pub fn place(layout: &MigLayout, profile: &'static MigProfile) -> Option<MigChoice> {
    place_where(layout, profile, &|_, _| true)
}

/// [`place`] among the starts `allowed` accepts.
pub fn place_where(
    layout: &MigLayout,
    profile: &'static MigProfile,
    allowed: &dyn Fn(&MigProfile, u8) -> bool,
) -> Option<MigChoice> {
    profile
        .starts
        .iter()
        .filter(|&&start| allowed(profile, start))
        .filter_map(|&start| {
            let placement = layout.check(profile, start).ok()?;
            let mut next = layout.clone();
            next.take(profile.name, start).ok()?;
            Some(MigChoice {
                profile,
                placement,
                after: next.free_score(),
                largest_after: next.largest_placeable(),
            })
        })
        .max_by(|a, b| {
            a.after
                .cmp(&b.after)
                .then(a.placement.start.cmp(&b.placement.start))
        })
}

/// The GPU (its position in `gpus`) and the choice on it for `request` (rule 3). When no
/// GPU can take it, the error of the first GPU that had a profile for it but no room (or,
/// if none had a profile, the first GPU's [`MigError::TooLarge`]).
pub fn choose_across(
    gpus: &[&MigLayout],
    request: &MigRequest,
) -> Result<(usize, MigChoice), MigError> {
    choose_across_where(gpus, &|_| *request, &|_, _, _| true)
}

/// [`choose_across`] with the request on each GPU given by `request` (GPU position: a
/// request in percent of a GPU's compute asks a different number of compute slices of a
/// 7-slice and a 4-slice model), among the placements `allowed` accepts (GPU position,
/// profile, start).
pub fn choose_across_where(
    gpus: &[&MigLayout],
    request: &dyn Fn(usize) -> MigRequest,
    allowed: &dyn Fn(usize, &MigProfile, u8) -> bool,
) -> Result<(usize, MigChoice), MigError> {
    let mut best: Option<(usize, MigChoice)> = None;
    let mut first_err: Option<MigError> = None;
    let key = |i: usize, c: &MigChoice| {
        (
            std::cmp::Reverse(c.profile.memory_bytes() - request(i).memory_bytes),
            std::cmp::Reverse(gpus[i].free_memory_slices()),
            c.largest_after.map(|p| (p.memory_slices, p.compute_slices)),
        )
    };
    for (i, layout) in gpus.iter().enumerate() {
        match choose_where(layout, &request(i), &|p, start| allowed(i, p, start)) {
            Ok(c) => {
                let better = best.as_ref().is_none_or(|(j, b)| key(i, &c) > key(*j, b));
                if better {
                    best = Some((i, c));
                }
            }
            Err(e) => {
                let replace = matches!(
                    (&first_err, &e),
                    (None, _)
                        | (
                            Some(MigError::TooLarge { .. }),
                            MigError::NoFreePlacement { .. }
                        )
                );
                if replace {
                    first_err = Some(e);
                }
            }
        }
    }
    best.ok_or_else(|| {
        first_err.unwrap_or_else(|| MigError::NoGpus {
            request: request(0).to_string(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::profiles::table_for;

    fn h100() -> &'static MigTable {
        table_for("NVIDIA H100 80GB HBM3", 81_559 << 20).unwrap()
    }

    fn req(gib: u64, compute: Option<u8>) -> MigRequest {
        MigRequest {
            memory_bytes: gib * GIB,
            compute_slices: compute,
        }
    }

    #[test]
    fn smallest_fitting_profile_on_an_h100() {
        let empty = MigLayout::new(h100());
        let pick = |gib, compute| choose(&empty, &req(gib, compute)).map(|c| c.profile.name);
        assert_eq!(pick(10, None).unwrap(), "1g.10gb");
        assert_eq!(pick(20, None).unwrap(), "2g.20gb");
        assert_eq!(pick(40, None).unwrap(), "3g.40gb");
        assert_eq!(pick(5, None).unwrap(), "1g.10gb");
        assert_eq!(pick(11, None).unwrap(), "2g.20gb");
        assert_eq!(pick(80, None).unwrap(), "7g.80gb");
        // Naming compute slices opens the memory-heavy profile and can raise the profile.
        assert_eq!(pick(20, Some(1)).unwrap(), "1g.20gb");
        assert_eq!(pick(10, Some(2)).unwrap(), "2g.20gb");
        assert_eq!(pick(10, Some(4)).unwrap(), "4g.40gb");
        let e = pick(81, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "H100 80GB: no MIG profile holds memory 81.0 GiB; the largest is 7g.80gb"
        );
        assert!(matches!(pick(10, Some(8)), Err(MigError::TooLarge { .. })));
    }

    #[test]
    fn other_models_pick_their_own_profiles() {
        let cases = [
            ("NVIDIA A100-SXM4-40GB", 40u64, 5u64, "1g.5gb"),
            ("NVIDIA A100-SXM4-40GB", 40, 10, "2g.10gb"),
            ("NVIDIA A30", 24, 7, "2g.12gb"),
            ("NVIDIA H200", 140, 20, "2g.35gb"),
            ("NVIDIA H200", 140, 71, "3g.71gb"),
            ("NVIDIA B200", 179, 23, "1g.23gb"),
        ];
        for (product, total, gib, want) in cases {
            let table = table_for(product, total * GIB).unwrap();
            let c = choose(&MigLayout::new(table), &req(gib, None)).unwrap();
            assert_eq!(c.profile.name, want, "{product} {gib} GiB");
        }
    }

    /// Instances already there, request GiB, expected profile and start.
    type Case = (&'static [(&'static str, u8)], u64, (&'static str, u8));

    #[test]
    fn placement_keeps_the_large_profiles() {
        let cases: &[Case] = &[
            // An empty GPU: a 1g goes to slice 6, keeping 4g.40gb at 0 and 3g.40gb at 0.
            (&[], 10, ("1g.10gb", 6)),
            // Next one beside it, still leaving 0-3 whole.
            (&[("1g.10gb", 6)], 10, ("1g.10gb", 5)),
            // A 2g.20gb goes to 4, not 0: the 4g.40gb at 0 stays possible.
            (&[], 20, ("2g.20gb", 4)),
            // With 4-7 taken by a 3g.40gb, a 1g.10gb takes 3 and keeps 2g.20gb at 0.
            (&[("3g.40gb", 4)], 10, ("1g.10gb", 3)),
            // With 0-3 taken, 2g.20gb has one start left.
            (&[("4g.40gb", 0)], 20, ("2g.20gb", 4)),
            // A 3g.40gb on an empty GPU goes to 4: 4g.40gb at 0 still fits beside it.
            (&[], 40, ("3g.40gb", 4)),
            // With a 1g at 6, the 3g.40gb must go to 0.
            (&[("1g.10gb", 6)], 40, ("3g.40gb", 0)),
        ];
        for (existing, gib, (profile, start)) in cases {
            let layout = MigLayout::with_instances(h100(), existing.iter().copied()).unwrap();
            let c = choose(&layout, &req(*gib, None)).unwrap();
            assert_eq!(
                (c.profile.name, c.placement.start),
                (*profile, *start),
                "existing {existing:?}, {gib} GiB"
            );
        }
    }

    #[test]
    fn a_full_gpu_says_what_was_tried() {
        // Slices 0-5 taken and one compute slice left: 1g.10gb at 6 still fits.
        let l = MigLayout::with_instances(
            h100(),
            [
                ("2g.20gb", 0),
                ("2g.20gb", 2),
                ("1g.10gb", 4),
                ("1g.10gb", 5),
            ],
        )
        .unwrap();
        let c = choose(&l, &req(10, None)).unwrap();
        assert_eq!((c.profile.name, c.placement.start), ("1g.10gb", 6));
        // With every compute slice used, nothing fits; the error lists what was tried.
        let l = MigLayout::with_instances(h100(), (0..7).map(|s| ("1g.10gb", s))).unwrap();
        let e = choose(&l, &req(10, None)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "H100 80GB: no free placement for memory 10.0 GiB (profiles tried: 1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)"
        );
        // Memory full with compute slices left: no room either.
        let l = MigLayout::with_instances(h100(), [("3g.40gb", 0), ("1g.20gb", 4), ("1g.20gb", 6)])
            .unwrap();
        let c = choose(&l, &req(10, None)).unwrap_err();
        assert!(matches!(c, MigError::NoFreePlacement { .. }));
    }

    #[test]
    fn legacy_mib_maps_to_the_smallest_fitting_profile() {
        let pick = |mib, compute| profile_for_mib(h100(), mib, compute).map(|p| p.name);
        assert_eq!(pick(0, None).unwrap(), "1g.10gb");
        assert_eq!(pick(10240, None).unwrap(), "1g.10gb");
        assert_eq!(pick(10241, None).unwrap(), "2g.20gb");
        assert_eq!(pick(20480, None).unwrap(), "2g.20gb");
        assert_eq!(pick(30000, None).unwrap(), "3g.40gb");
        assert_eq!(pick(81920, None).unwrap(), "7g.80gb");
        assert_eq!(pick(20480, Some(1)).unwrap(), "1g.20gb");
        let e = pick(81921, None).unwrap_err();
        assert!(matches!(e, MigError::TooLarge { .. }), "{e}");
        assert!(matches!(
            pick(u64::MAX, None),
            Err(MigError::TooLarge { .. })
        ));
        let a30 = table_for("NVIDIA A30", 24 * GIB).unwrap();
        assert_eq!(profile_for_mib(a30, 7000, None).unwrap().name, "2g.12gb");
    }

    #[test]
    fn allowed_placements_restrict_the_choice() {
        let empty = MigLayout::new(h100());
        // Only starts below 4: the 1g.10gb that would go to 6 goes to 3.
        let c = choose_where(&empty, &req(10, None), &|_, s| s < 4).unwrap();
        assert_eq!((c.profile.name, c.placement.start), ("1g.10gb", 3));
        // No 1g.10gb allowed at all: the next profile that holds 10 GiB.
        let c = choose_where(&empty, &req(10, None), &|p, _| p.name != "1g.10gb").unwrap();
        assert_eq!(c.profile.name, "2g.20gb");
        let e = choose_where(&empty, &req(10, None), &|_, _| false).unwrap_err();
        assert!(matches!(e, MigError::NoFreePlacement { .. }), "{e}");
        // Across GPUs: the GPU allowed nothing is skipped even when it is the better one.
        let used = MigLayout::with_instances(h100(), [("3g.40gb", 4)]).unwrap();
        let ten = |_| req(10, None);
        let (i, _) = choose_across_where(&[&used, &empty], &ten, &|g, _, _| g == 1).unwrap();
        assert_eq!(i, 1);
        // A request per GPU: two compute slices asked of the first GPU only.
        let each = |g| req(10, (g == 0).then_some(2));
        let (i, c) = choose_across_where(&[&empty, &empty], &each, &|_, _, _| true).unwrap();
        assert_eq!((i, c.profile.name), (1, "1g.10gb"));
    }

    #[test]
    fn across_gpus_fills_the_used_gpu_first() {
        let empty = MigLayout::new(h100());
        let used = MigLayout::with_instances(h100(), [("3g.40gb", 4)]).unwrap();
        let full = MigLayout::with_instances(h100(), [("4g.40gb", 0), ("3g.40gb", 4)]).unwrap();
        let (i, c) = choose_across(&[&empty, &used, &full], &req(10, None)).unwrap();
        assert_eq!((i, c.profile.name, c.placement.start), (1, "1g.10gb", 3));
        // A request only the empty GPU can hold goes there.
        let (i, c) = choose_across(&[&full, &used, &empty], &req(70, None)).unwrap();
        assert_eq!((i, c.profile.name), (2, "7g.80gb"));
        // Same waste: the GPU with fewer free slices (an A100 40GB's 3g.20gb beside a 1g)
        // rather than the empty H100's 2g.20gb.
        let a100 = table_for("NVIDIA A100-SXM4-40GB", 40 * GIB).unwrap();
        let small = MigLayout::with_instances(a100, [("1g.5gb", 6)]).unwrap();
        let (i, c) = choose_across(&[&empty, &small], &req(20, None)).unwrap();
        assert_eq!((i, c.profile.name), (1, "3g.20gb"));
        // Least waste first: 6 GiB fits an A30's 1g.6gb exactly, an H100's 1g.10gb wastes
        // 4 GiB, even though the H100 is the fuller GPU.
        let a30 = MigLayout::new(table_for("NVIDIA A30", 24 * GIB).unwrap());
        let (i, c) = choose_across(&[&used, &a30], &req(6, None)).unwrap();
        assert_eq!((i, c.profile.name), (1, "1g.6gb"));
        // Nothing fits: the error says no room, not too large.
        let e = choose_across(&[&full, &full], &req(10, None)).unwrap_err();
        assert!(matches!(e, MigError::NoFreePlacement { .. }), "{e}");
        let e = choose_across(&[&full], &req(100, None)).unwrap_err();
        assert!(matches!(e, MigError::TooLarge { .. }), "{e}");
        assert!(matches!(
            choose_across(&[], &req(1, None)),
            Err(MigError::NoGpus { .. })
        ));
    }
}
