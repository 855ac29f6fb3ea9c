//! The configured policy instance of this component.
//!
//! A component holds exactly one policy; the host calls `configure` once, then the decision
//! function any number of times, on one thread.

use std::any::Any;
use std::cell::RefCell;

thread_local! {
    static POLICY: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

pub fn set<T: 'static>(policy: T) {
    POLICY.with(|slot| *slot.borrow_mut() = Some(Box::new(policy)));
}

pub fn with<T: 'static, R>(call: impl FnOnce(&mut T) -> R) -> R {
    POLICY.with(|slot| {
        let mut slot = slot.borrow_mut();
        let policy = slot
            .as_mut()
            .and_then(|policy| policy.downcast_mut::<T>())
            .expect("the host called the policy before `configure` succeeded");
        call(policy)
    })
}
