"""The federated round loop (:mod:`.loop`) and its run inside a stage (:mod:`.runner`), above
the strategies it drives (:mod:`fedssl.strategies`) and the state they share (:mod:`fedssl.fl`)."""
