"""One step module per workflow rule: ``pipeline/<rule>.py`` is run by ``scripts/<rule>.py`` and
declared in ``rules/<rule>.smk``. A step reads its inputs, calls the maths, and writes its
artifacts atomically; a DVC stage depends only on the modules its step reaches."""
