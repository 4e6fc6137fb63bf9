// placeholder until the tree walk lands
