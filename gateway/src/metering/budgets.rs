//! Budgets as admission and the meter see them: which apply to a session
//! (key → team → route, [`applicable_budgets`]) and how a spent one is
//! worded ([`budget_message`]) and refused (402 `insufficient_quota`).

use http::StatusCode;

use crate::admission::Refusal;
use crate::auth::{KeyEntry, TeamEntry};
use crate::config::BudgetPeriod;
use crate::store::{BudgetKey, Scope};

/// The budgets that apply to a session, with their limits: key → team →
/// route, each only when it has a `budget_usd`.
pub fn applicable_budgets(
    key: &KeyEntry,
    team: Option<&TeamEntry>,
    route_model: &str,
    route_budget: Option<(f64, BudgetPeriod)>,
) -> Vec<(BudgetKey, f64)> {
    let mut out = Vec::with_capacity(3);
    if let Some(limit) = key.budget_usd {
        out.push((
            BudgetKey {
                scope: Scope::Key,
                id: key.id.clone(),
                period: key.budget_period,
            },
            limit,
        ));
    }
    if let Some(t) = team {
        if let Some(limit) = t.budget_usd {
            out.push((
                BudgetKey {
                    scope: Scope::Team,
                    id: t.id.clone(),
                    period: t.budget_period,
                },
                limit,
            ));
        }
    }
    if let Some((limit, period)) = route_budget {
        out.push((
            BudgetKey {
                scope: Scope::Route,
                id: route_model.to_string(),
                period,
            },
            limit,
        ));
    }
    out
}

/// "budget exceeded for team 'support' (limit $50.00)".
pub fn budget_message(b: &BudgetKey, limit: f64) -> String {
    let period = match b.period {
        BudgetPeriod::Total => "",
        BudgetPeriod::Daily => " per day",
        BudgetPeriod::Monthly => " per month",
    };
    format!(
        "budget exceeded for {} '{}' (limit ${}{period})",
        b.scope.as_str(),
        b.id,
        usd(limit)
    )
}

/// Cents, unless that would misstate the amount (`0.005` → `0.005`).
pub(crate) fn usd(v: f64) -> String {
    let cents = format!("{v:.2}");
    if cents.parse::<f64>().is_ok_and(|c| (c - v).abs() < 1e-9) {
        return cents;
    }
    let fine = format!("{v:.6}");
    fine.trim_end_matches('0').to_string()
}

pub(crate) fn budget_refusal(b: &BudgetKey, limit: f64) -> Refusal {
    Refusal::new(
        StatusCode::PAYMENT_REQUIRED,
        "insufficient_quota",
        "insufficient_quota",
        budget_message(b, limit),
    )
}
