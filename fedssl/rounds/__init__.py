"""The federated round loop (:mod:`.loop`), a method's recipe and the one builder that makes a
federation of it (:mod:`.recipe`), and its run inside a stage (:mod:`.runner`), above the
strategies it drives (:mod:`fedssl.strategies`) and the state they share (:mod:`fedssl.fl`)."""
