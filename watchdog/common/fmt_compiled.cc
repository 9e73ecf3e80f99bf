// fmt's compiled part, built once: every other file sees fmt's declarations only (FMT_HEADER_ONLY
// is not defined), instead of compiling format-inl.h again in each file that logs. Linked
// statically and hidden (FMT_API is empty without FMT_SHARED), so that ncclguard's fmt never meets
// a host application's own.
#include <locale>  // IWYU pragma: keep (std::locale, below, where a locale is used)

#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {

// The templates that format.h declares and only format-inl.h defines, for the types ncclguard
// formats: floating point numbers, and characters (locale-aware or, with
// FMT_STATIC_THOUSANDS_SEPARATOR, without a locale).
template auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;
#ifndef FMT_STATIC_THOUSANDS_SEPARATOR
template locale_ref::locale_ref(const std::locale& loc);
template auto locale_ref::get<std::locale>() const -> std::locale;
#endif
template auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template auto decimal_point_impl(locale_ref) -> char;

}  // namespace detail
FMT_END_NAMESPACE
