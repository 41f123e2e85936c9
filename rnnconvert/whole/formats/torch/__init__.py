"""The ``.pt2`` container (:mod:`.spec`, :mod:`.pt2_write`) and the emitted ``nn.Module`` source (:mod:`.module_write`)."""
