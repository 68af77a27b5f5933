//! The DFlash2 head's keys (`drafter.conv_*`, `drafter.selector_*`, the unary-logit transform)
//! and `[training.dflash2]`: each only with `head = "dflash2"`, each in the range SpecForge's
//! `DFlash2DraftModel` accepts.
use super::{in_range, positive};
use crate::config::dflash2::Dflash2Section;
use crate::config::error::ConfigIssue;
use crate::config::sections::DrafterHead;
use crate::config::Config;

pub(super) fn dflash2_head(c: &Config, v: &mut Vec<ConfigIssue>) {
    let d = &c.drafter;
    let keys = [
        ("drafter.conv_kernel_size", d.conv_kernel_size.is_some()),
        ("drafter.conv_group_size", d.conv_group_size.is_some()),
        ("drafter.selector_rank", d.selector_rank.is_some()),
        ("drafter.selector_top_k", d.selector_top_k.is_some()),
        ("drafter.output_multiplier", d.output_multiplier.is_some()),
        (
            "drafter.final_logit_softcapping",
            d.final_logit_softcapping.is_some(),
        ),
    ];
    if d.head != DrafterHead::Dflash2 {
        for (key, set) in keys {
            if set {
                v.push(
                    ConfigIssue::invalid(
                        key,
                        "no value unless drafter.head = \"dflash2\"",
                        "a value",
                    )
                    .with_hint("set drafter.head = \"dflash2\", or remove the key"),
                );
            }
        }
        if !c.training.dflash2.is_default() {
            v.push(
                ConfigIssue::invalid(
                    "training.dflash2",
                    "no section unless drafter.head = \"dflash2\"",
                    "a section",
                )
                .with_hint("set drafter.head = \"dflash2\", or remove [training.dflash2]"),
            );
        }
        return;
    }
    if let Some(taps) = d.conv_kernel_size {
        if taps == 0 || taps > d.block_size {
            v.push(
                ConfigIssue::invalid(
                    "drafter.conv_kernel_size",
                    format!("1..={} (drafter.block_size)", d.block_size),
                    taps,
                )
                .with_hint("the convolution runs inside one block; SpecForge uses 2"),
            );
        }
    }
    if let Some(group) = d.conv_group_size {
        if group == 0 || d.hidden_size % group != 0 {
            v.push(
                ConfigIssue::invalid(
                    "drafter.conv_group_size",
                    format!("a divisor of drafter.hidden_size ({})", d.hidden_size),
                    group,
                )
                .with_hint("SpecForge uses 16"),
            );
        }
    }
    if let Some(rank) = d.selector_rank {
        positive(v, "drafter.selector_rank", rank);
    }
    if let Some(k) = d.selector_top_k {
        positive(v, "drafter.selector_top_k", k);
    }
    for (key, value) in [
        ("drafter.output_multiplier", d.output_multiplier),
        ("drafter.final_logit_softcapping", d.final_logit_softcapping),
    ] {
        if let Some(value) = value {
            in_range(
                v,
                key,
                value,
                f64::MIN_POSITIVE,
                f64::MAX,
                "a positive number",
            );
        }
    }
    selector_schedule(&c.training.dflash2, v);
}

fn selector_schedule(s: &Dflash2Section, v: &mut Vec<ConfigIssue>) {
    in_range(
        v,
        "training.dflash2.selector_loss_alpha",
        s.selector_loss_alpha,
        0.0,
        f64::MAX,
        "a non-negative number (0: the selector keeps its initial weights)",
    );
    for (key, value) in [
        (
            "training.dflash2.selector_warmup_ratio",
            s.selector_warmup_ratio,
        ),
        (
            "training.dflash2.selector_ramp_ratio",
            s.selector_ramp_ratio,
        ),
    ] {
        in_range(v, key, value, 0.0, 1.0, "a fraction of the run in [0, 1]");
    }
    if s.selector_warmup_ratio + s.selector_ramp_ratio > 1.0 {
        v.push(
            ConfigIssue::invalid(
                "training.dflash2",
                "selector_warmup_ratio + selector_ramp_ratio at most 1",
                format!("{} + {}", s.selector_warmup_ratio, s.selector_ramp_ratio),
            )
            .with_hint("the selector term would never reach its full weight within the run"),
        );
    }
}
