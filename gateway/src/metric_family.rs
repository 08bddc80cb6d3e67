//! [`Declared`]: a metric registered so that its `# HELP` and `# TYPE`
//! lines are exported from the start, before it has any series.
//!
//! prometheus-client leaves a family with no series out of the exposition
//! altogether, so a dashboard or alert on a counter that has not counted
//! yet reads "no data" (and `rate()` of it nothing) instead of 0. Every
//! metric of [`crate::metrics::Metrics`] is registered through this
//! wrapper; the series whose labels are known at start are also created at
//! 0 (see [`crate::metrics::ModelMeters::export_at_zero`] and
//! [`crate::upstream::series`]).

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;

/// `M`, encoded even while it has no series.
#[derive(Debug)]
pub struct Declared<M>(pub M);

impl<M: EncodeMetric> EncodeMetric for Declared<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }

    /// Never empty: the family's descriptor is always written.
    fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::registry::Registry;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
    struct L {
        model: String,
    }

    #[test]
    fn a_declared_family_without_series_still_has_its_type_line() {
        let mut r = Registry::with_prefix("p");
        r.register("bare", "h", Family::<L, Counter>::default());
        r.register("declared", "h", Declared(Family::<L, Counter>::default()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        assert!(!text.contains("p_bare"), "{text}");
        assert!(text.contains("# TYPE p_declared counter\n"), "{text}");
    }
}
