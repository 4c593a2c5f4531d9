//! NOTE [Serving a container] end to end, each "process" a service of its own
//! (`Registry::standalone`) in this one: claims, waits, take-overs, refusals. (fork, with the
//! process's own service: fork.rs.)

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{build, fresh_name, items, region, ANY};
use rloader_shared::{Claim, Container, Expect, Family, Name, Polled, Registry};

fn wait(w: &mut rloader_shared::Waiting) -> Polled {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match w.poll(Duration::from_millis(100)).unwrap() {
            Polled::Pending if Instant::now() < deadline => continue,
            Polled::Pending => panic!("no answer within 30 s"),
            done => return done,
        }
    }
}

fn attach(s: &'static Registry, name: &Name) -> Arc<Container> {
    let mut w = s.connect(name, ANY).unwrap().expect("someone serves it");
    match wait(&mut w) {
        Polled::Ready(c) => c,
        _ => panic!("the server closed the connection"),
    }
}

/// Waits (bounded) for a condition another thread makes true.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "not within 30 s: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn one_builds_and_the_others_wait_for_it() {
    let (a, b, c) = (
        Registry::standalone(),
        Registry::standalone(),
        Registry::standalone(),
    );
    let name = fresh_name("wait");
    let Claim::Build(builder) = a.claim(&name, ANY).unwrap() else {
        panic!("a builds")
    };
    let mut waiters: Vec<_> = [b, c]
        .iter()
        .map(|s| match s.claim(&name, ANY).unwrap() {
            Claim::Wait(w) => w,
            Claim::Build(_) => panic!("the name is claimed"),
        })
        .collect();
    for w in &mut waiters {
        assert!(matches!(w.poll(Duration::ZERO).unwrap(), Polled::Pending));
    }
    let built = builder.serve(region(&[b"x", b"yz"]).0).unwrap();
    for w in &mut waiters {
        let Polled::Ready(got) = wait(w) else {
            panic!("closed")
        };
        assert_eq!(items(&got), vec![b"x".to_vec(), b"yz".to_vec()]);
        assert_eq!(got.inode(), built.inode(), "the same memfd, not a copy");
        assert_eq!(got.name(), Some(name.clone()));
    }
    assert!(a.serves(&name) && !b.serves(&name) && !c.serves(&name));
}

#[test]
fn waiters_claim_again_when_the_builder_fails() {
    let (a, b) = (Registry::standalone(), Registry::standalone());
    let name = fresh_name("fails");
    let Claim::Build(builder) = a.claim(&name, ANY).unwrap() else {
        panic!()
    };
    let Claim::Wait(mut w) = b.claim(&name, ANY).unwrap() else {
        panic!()
    };
    drop(builder); // the build raised
    assert!(matches!(wait(&mut w), Polled::Closed));
    assert!(matches!(b.claim(&name, ANY).unwrap(), Claim::Build(_)));
}

#[test]
fn a_watcher_takes_over_when_the_server_goes() {
    let (a, b, c, d) = (
        Registry::standalone(),
        Registry::standalone(),
        Registry::standalone(),
        Registry::standalone(),
    );
    let name = fresh_name("takeover");
    let first = build(a, &name, &[b"p", b"q"]);
    let inode = first.inode();
    let on_b = attach(b, &name);
    let on_c = attach(c, &name);
    drop(first); // the server goes: b or c serves from now on
    eventually("b or c serves", || b.serves(&name) || c.serves(&name));
    let on_d = attach(d, &name);
    assert_eq!(items(&on_d), vec![b"p".to_vec(), b"q".to_vec()]);
    assert_eq!(on_d.inode(), inode);
    // Whichever serves goes too: the other takes over.
    let (server, other, other_service) = if b.serves(&name) {
        (on_b, on_c, c)
    } else {
        (on_c, on_b, b)
    };
    drop(server);
    eventually("the last watcher serves", || {
        other_service.serves(&name) || d.serves(&name)
    });
    drop(other);
    drop(on_d);
    // Nobody holds it: the name is free.
    eventually("the name is free", || {
        matches!(Registry::standalone().connect(&name, ANY), Ok(None))
    });
}

#[test]
fn a_container_built_again_under_the_same_name_is_refused_by_its_old_hash() {
    let (a, b) = (Registry::standalone(), Registry::standalone());
    let name = fresh_name("rebuilt");
    let (r, old_hash) = region(&[b"old"]);
    let Claim::Build(builder) = a.claim(&name, ANY).unwrap() else {
        panic!()
    };
    drop(builder.serve(r).unwrap());
    let _new = build(a, &name, &[b"new"]);
    let expect = Expect {
        family: Family::List,
        hash: Some(old_hash),
    };
    let mut w = b.connect(&name, expect).unwrap().unwrap();
    let err = loop {
        match w.poll(Duration::from_secs(10)) {
            Err(e) => break e,
            Ok(Polled::Pending) => continue,
            Ok(_) => panic!("attached to other items"),
        }
    };
    assert!(err.to_string().contains("content hash"), "{err}");
    let wrong_family = Expect {
        family: Family::Map,
        hash: None,
    };
    let mut w = b.connect(&name, wrong_family).unwrap().unwrap();
    assert!(matches!(
        w.poll(Duration::from_secs(10)),
        Err(rloader_shared::SharedError::Mismatch(_))
    ));
}

#[test]
fn an_unnamed_container_is_served_once_published() {
    let (a, b) = (Registry::standalone(), Registry::standalone());
    let c = Container::unnamed(region(&[b"local"]).0, a).unwrap();
    assert_eq!(c.name(), None);
    let name = c.publish(Family::List).unwrap();
    assert_eq!(c.publish(Family::List).unwrap(), name, "published once");
    assert_eq!(items(&attach(b, &name)), vec![b"local".to_vec()]);
    drop(c);
}

#[test]
fn a_second_attach_in_a_process_maps_nothing_new() {
    let (a, b) = (Registry::standalone(), Registry::standalone());
    let name = fresh_name("twice");
    let _built = build(a, &name, &[b"1"]);
    let one = attach(b, &name);
    let two = attach(b, &name);
    assert!(Arc::ptr_eq(&one, &two));
    assert!(Arc::ptr_eq(&b.local(&name).unwrap(), &one));
}
