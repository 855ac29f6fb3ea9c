use crate::__private::wit_types;

/// One named measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    pub name: String,
    pub value: f64,
}

/// Named measurements of a model, looked up by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics(Vec<Metric>);

impl Metrics {
    /// The value of the metric called `name`, if present (the first one, if repeated).
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.iter().find(|m| m.name == name).map(|m| m.value)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Metric> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<S: Into<String>> FromIterator<(S, f64)> for Metrics {
    fn from_iter<I: IntoIterator<Item = (S, f64)>>(iter: I) -> Self {
        Metrics(iter.into_iter().map(|(name, value)| Metric { name: name.into(), value }).collect())
    }
}

impl From<Vec<wit_types::Metric>> for Metrics {
    fn from(list: Vec<wit_types::Metric>) -> Self {
        list.into_iter().map(|m| (m.name, m.value)).collect()
    }
}
