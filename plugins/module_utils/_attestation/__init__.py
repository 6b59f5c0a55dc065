# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Evidence (TPM quotes, SEV-SNP reports, TDX quotes), its verification, and measurement policies (DESIGN section 3)."""

# The evidence variants register themselves when imported; importing them here registers them whatever a caller
# imports first (a new variant adds its line).
from . import tpm_variant  # noqa: F401  (first registered: the issuer's default)

# isort: split
from . import sev_snp_variant, tdx_variant  # noqa: F401
