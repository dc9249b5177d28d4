"""The QRE maths (pure: arrays in, arrays out, no I/O): the factored PIP (``spectrum``), QRE
features w.r.t. the unit base encoder (``features``), exact QRE between two encoders
(``pairwise``) and the slow dense references they are tested against (``reference``)."""
