// Anchor translation unit for the targets that own the precompiled headers.
